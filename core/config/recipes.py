"""A recipe file as plain data: YAML with no key given twice, merged onto its `base:` chain."""

from __future__ import annotations

import os
from typing import Any

import yaml

from .errors import ConfigError
from .moved_keys import move_keys


def read_recipe(path: str, notes: list[str] | None = None) -> dict[str, Any]:
    """The recipe at `path` as plain data, merged onto its `base:` chain, before any schema check or
    interpolation (what a tool that derives recipes from recipes starts from). Each file's moved
    keys (moved_keys.py) are rewritten before it merges, with a note each in `notes`."""
    return _recipe(path, [], [] if notes is None else notes)


class DuplicateKey(Exception):
    """A key given twice in one YAML mapping (YAML's own loaders keep the last silently)."""


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """yaml's SafeLoader (libyaml's parser where installed), refusing a mapping that gives a key twice (naming both lines)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(
                    f"key '{key}' is given twice in one mapping (lines {seen[key]} and {line}): keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _recipe(path: str, chain: list[str], notes: list[str]) -> dict[str, Any]:
    """The recipe at `path` as a mapping, on top of its `base:` recipe when it names one (a path
    relative to the recipe's folder): sections merge key by key, stages by name (a stage of the
    same name merges into the base's, a new name goes right after the stage listed before it, at the
    end when it is listed first), other lists are replaced."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"config file '{path}' not found" + (f" (the base of {chain[-1]})" if chain else "")
        )
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        first = " ".join(str(e).split())
        raise ConfigError(f"{path}: invalid YAML ({first})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    notes += [f"{path}: {note}" for note in move_keys(data, where=f"{path}: ")]
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be the path of another recipe, got {base!r}")
    base_path = os.path.normpath(os.path.join(os.path.dirname(path), base))
    if os.path.abspath(base_path) in [os.path.abspath(p) for p in chain + [path]]:
        raise ConfigError(
            f"{path}: base '{base}' leads back to itself ({' -> '.join(chain + [path, base_path])})"
        )
    return _over(_recipe(base_path, chain + [path], notes), data)


def _over(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if key == "stages" and isinstance(value, list) and isinstance(base.get(key), list):
            out[key] = _stages_over(base[key], value)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _over(base[key], value)
        else:
            out[key] = value
    return out


def _stages_over(base: list[Any], top: list[Any]) -> list[Any]:
    """`top`'s stages over `base`'s by name; a new stage goes right after the one `top` lists before
    it (at the end when it comes first)."""
    merged = list(base)
    at = len(merged)  # where a new stage goes
    for stage in top:
        names = [s.get("name") if isinstance(s, dict) else None for s in merged]
        name = stage.get("name") if isinstance(stage, dict) else None
        if name is not None and name in names:
            i = names.index(name)
            merged[i] = _over(merged[i], stage)
        else:
            i = at
            merged.insert(i, stage)
        at = i + 1
    return merged
