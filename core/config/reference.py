"""The configuration reference, read off the schema: every key's dotted path, type, default, allowed
values and docstring (the string under the field, or under the section's class), for the docs site's
generated page (scripts/gen_docs.py -> docs/reference/config.md) and `rlcore config explain KEY`.
Both come from here, so neither can drift from the schema.

A list of sections (buffer.explorer_input.eval_tasksets, model.lora_configs, ...) is one entry per
key of its items, written `path[].key`; `explain` takes `path[2].key` or `path.2.key` too.

Plain Python (no torch): the schema's own modules, `ast` for the docstrings.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import re
import textwrap
import typing
from dataclasses import MISSING, dataclass
from functools import cache
from typing import Any

from ..registry import import_path
from .schema import RLCoreConfig

NUMERIC_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}

READ_BY = {
    "trainer.megatron": "strategy megatron only",
    "trainer.fsdp_config": "strategies fsdp and fsdp2 only",
    "trainer.tinker": "a trainer.remote tinker://... run only",
}
"""Sections only some strategies or runs read (the rest is read wherever it applies: the
docstrings say when a key matters only in some modes)."""


@dataclass
class KeyEntry:
    path: str
    """Dotted path; a list of sections' item keys as `path[].key`."""
    type: str
    default: str
    """As YAML would write it (JSON for containers); empty for a section."""
    allowed: str
    """Choices or bounds, in words (empty: any value of the type)."""
    doc: str
    section: bool = False
    """A group of keys (a dataclass), not a value."""
    read_by: str = ""


def entries() -> list[KeyEntry]:
    """Every key and section of the schema, depth first in declaration order."""
    out: list[KeyEntry] = []
    _walk(RLCoreConfig, "", out)
    return out


def explain(key: str) -> str:
    """A key's entry for the terminal (a section's: its text and its keys); ValueError in one line
    for a key the schema does not have, with the closest ones."""
    path = normalise(key)
    by_path = {e.path: e for e in entries()}
    entry = by_path.get(path)
    if entry is None:
        close = difflib.get_close_matches(path, list(by_path), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `rlcore config explain algorithm` lists a section's keys"
        raise ValueError(f"config explain: '{key}' is not a key of the schema{hint}")
    lines = [entry.path, f"  type:    {entry.type}"]
    if not entry.section:
        lines.append(f"  default: {entry.default}")
    if entry.allowed:
        lines.append(f"  allowed: {entry.allowed}")
    if entry.read_by:
        lines.append(f"  read by: {entry.read_by}")
    if entry.doc:
        lines += ["", *textwrap.wrap(entry.doc, 96, initial_indent="  ", subsequent_indent="  ")]
    if entry.section:
        heads = (f"{entry.path}.", f"{entry.path}[].")  # a section's keys, a list's items' keys
        inside = [e for e in by_path.values() if _parent(e.path) in (entry.path, f"{entry.path}[]")]
        lines += ["", "  keys (of each item):" if entry.type.startswith("list of") else "  keys:"]
        for e in inside:
            name = next(e.path.removeprefix(h) for h in heads if e.path.startswith(h))
            lines.append(f"    {name}  ({e.type}{'' if e.section else ', default ' + e.default})")
    return "\n".join(lines)


def anchor(path: str) -> str:
    """The reference page's anchor of a key: its path without `[]` (reference/config.md#algorithm.optimizer.lr)."""
    return path.replace("[]", "")


def normalise(key: str) -> str:
    """`a.b[3].c` and `a.b.3.c` as the reference writes them: `a.b[].c`."""
    key = re.sub(r"\[\d*\]", "[]", key.strip())
    return re.sub(r"\.(\d+)(?=\.|$)", "[]", key)


def markdown() -> str:
    """The docs site's configuration reference page."""
    out = [
        "# Configuration keys",
        "",
        "Every key of rlcore's config schema (`core/config/schema/`): its dotted path, type, default, "
        "allowed values and what it does. Generated from the schema by `python scripts/gen_docs.py` "
        "(the tests fail when this page is not current); `rlcore config explain KEY` prints one entry in "
        "the terminal. A recipe (`configs/*.yaml`) holds overrides only; `rlcore config show my.yaml` "
        "prints the resolved config, and a stage's own section overrides the run's for that stage.",
        "",
    ]
    for e in entries():
        depth = e.path.count(".") + 1
        if e.section:
            out += [f"{'#' * min(2 + depth - 1, 4)} `{e.path}` {{#{anchor(e.path)}}}", ""]
            if e.doc:
                out += [_escape(e.doc), ""]
            if e.read_by:
                out += [f"Read by: {e.read_by}.", ""]
            continue
        facts = [f"type `{e.type}`", f"default `{e.default}`"]
        if e.allowed:
            facts.append(f"allowed: {e.allowed}")
        out += [f'- <a id="{anchor(e.path)}"></a>**`{e.path}`** — {"; ".join(facts)}.', ""]
        if e.doc:
            out += [textwrap.indent(_escape(e.doc), "    "), ""]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------------- the walk


def _walk(cls: type, prefix: str, out: list[KeyEntry]) -> None:
    docs = _field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        inner = _section_type(hint)
        if inner is not None:
            listed = typing.get_origin(hint) is list
            doc = docs.get(f.name) or _class_doc(inner)
            if listed and docs.get(f.name) and _class_doc(inner):
                doc = f"{docs[f.name]} Each item: {_class_doc(inner)}"
            out.append(KeyEntry(path, f"list of {inner.__name__}" if listed else inner.__name__, "", "", doc,
                                section=True, read_by=_read_by(path)))  # fmt: skip
            _walk(inner, f"{path}[]." if listed else f"{path}.", out)
            continue
        out.append(KeyEntry(path, _type_name(hint), _default(f), _allowed(f), docs.get(f.name, ""), read_by=_read_by(path)))


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds (itself, or the items of a list of them), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (None,)
        if dataclasses.is_dataclass(item) and isinstance(item, type):
            return item
    return None


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(hint))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(hint))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]" if args else getattr(origin, "__name__", str(origin))
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def _default(f: dataclasses.Field) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value)
    return str(value)


def _allowed(f: dataclasses.Field) -> str:
    meta = f.metadata
    parts = []
    choices = meta.get("choices")
    if isinstance(choices, tuple):
        parts.append(", ".join(f"`{c}`" for c in choices))
    elif isinstance(choices, str):  # a lazy registry: its names, nothing it names imported
        parts.append(", ".join(f"`{name}`" for name in import_path(choices, "registry")))
    if meta.get("by_path"):
        parts.append("or an import path `pkg.mod:attr`")
    bounds = [f"{NUMERIC_BOUNDS[k]} {meta[k]}" for k in NUMERIC_BOUNDS if k in meta]
    if bounds:
        parts.append(" and ".join(bounds))
    if meta.get("must_exist"):
        parts.append("a path that exists")
    return " ".join(parts)


def _read_by(path: str) -> str:
    bare = path.replace("[]", "")
    return next((who for prefix, who in READ_BY.items() if bare == prefix or bare.startswith(prefix + ".")), "")


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("[]"))
    return path[:cut] if cut > 0 else ""


@cache
def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of `cls` (its own and its bases')."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, [*body.body[1:], None], strict=True):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[stmt.target.id] = _flat(after.value.value)
    return docs


def _class_doc(cls: type) -> str:
    return _flat(cls.__doc__ or "") if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}(") else ""


def _flat(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split())


def _escape(text: str) -> str:
    """Docstring text safe in Markdown: a `<tag>` shown as text, not taken for HTML."""
    return re.sub(r"(?<!`)<(/?[A-Za-z][^>]*)>(?!`)", r"&lt;\1&gt;", text)
