"""What an unknown key was probably meant to be: rlcore's name for another project's key
(renamed_keys.py), the same words in another order (node_num: num_nodes), the same name in another
section (trainer.lr: algorithm.optimizer.lr), or the closest spelling in its section."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from typing import Any

from .renamed_keys import Renamed, renamed


def unknown_key_problems(path: str, key: Any, value: Any, allowed: list[str]) -> list[str]:
    """One line per problem of the unknown key at `path` (its last part `key`, set to `value`, where
    `allowed` are the keys of its section): the key itself, or, for a section of another project's
    config (NexRL's `data:`), each key under it that has an rlcore name, with that name."""
    hit = renamed(path)
    if hit is not None:
        return [_renamed_line(path, *hit)]
    lines: list[str] = []
    unnamed = _renamed_below(path, value, lines)
    if not lines or unnamed:
        lines.append(
            f"{path}: unknown key{_guess(path, str(key), allowed)}; allowed keys here: {', '.join(allowed)}"
        )
    return lines


def _renamed_line(path: str, rlcore_key: str, entry: Renamed) -> str:
    note = f"; {entry.note}" if entry.note else ""
    return f"{path}: unknown key; did you mean rlcore's {rlcore_key}? ({entry.source}'s name{note})"


def _renamed_below(path: str, value: Any, lines: list[str]) -> int:
    """Appends a line for each key under `path` that has an rlcore name; returns how many keys under
    it have none (a value that is no mapping counts as one)."""
    if not isinstance(value, dict) or not value:
        return 1
    unnamed = 0
    for k, v in value.items():
        hit = renamed(f"{path}.{k}")
        if hit is not None:
            lines.append(_renamed_line(f"{path}.{k}", *hit))
        else:
            unnamed += _renamed_below(f"{path}.{k}", v, lines)
    return unnamed


def _guess(path: str, key: str, allowed: list[str]) -> str:
    """' (did you mean X?)' or ''."""
    words = _words(key)
    same_words = [k for k in allowed if _words(k) == words]
    if same_words:
        return f" (did you mean {same_words[0]}?)"
    elsewhere = _same_name_elsewhere(path, key)
    if elsewhere:
        return f" (did you mean {' or '.join(elsewhere)}?)"
    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _words(key: str) -> frozenset[str]:
    """The words of a key, order and plural aside: node_num and num_nodes give {node, num}."""
    return frozenset(w.removesuffix("s") for w in key.lower().split("_") if w)


def _same_name_elsewhere(path: str, key: str) -> list[str]:
    """rlcore's keys named `key` in other sections, those nearest `path` and, of them, the least
    nested (at most 3): a key set in the wrong section."""
    stage = re.match(r"stages\[\d+\]\.", path)
    prefix = stage.group(0) if stage else ""
    rest = re.sub(r"\[\d+\]", "[]", path[len(prefix) :])
    parent = rest.rpartition(".")[0]
    found = [p for p in _schema_paths() if p.rpartition(".")[2] == key]
    nearest = max((len(_common_prefix(p, parent)) for p in found), default=0)
    found = [p for p in found if len(_common_prefix(p, parent)) == nearest]
    shallowest = min((p.count(".") for p in found), default=0)
    found = [p for p in found if p.count(".") == shallowest]
    # list indices of `path` written back where the candidate shares them
    actual = path[len(prefix) :].rpartition(".")[0]
    shown = [
        prefix + (actual + p[len(parent) :] if parent and p.startswith(parent + ".") else p) for p in found
    ]
    return shown[:3]


def _common_prefix(a: str, b: str) -> str:
    parts = []
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        parts.append(x)
    return ".".join(parts)


@functools.cache
def _schema_paths() -> tuple[str, ...]:
    """Every leaf key of the schema, dotted (`[]` for a list of sections)."""
    from .schema import RLCoreConfig

    out: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, hint in typing.get_type_hints(cls).items():
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            section = hint if dataclasses.is_dataclass(hint) else None
            if section is None and len(args) == 1 and dataclasses.is_dataclass(args[0]):
                section = args[0]  # an optional section, or a list of sections
                name += "[]" if typing.get_origin(hint) is list else ""
            if isinstance(section, type):
                walk(section, f"{prefix}{name}.")
            else:
                out.append(prefix + name)

    walk(RLCoreConfig, "")
    return tuple(out)
