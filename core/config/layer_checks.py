"""A config layer (a recipe, an override, a stage's sections) checked against the schema before
OmegaConf merges it, and OmegaConf's errors as one line naming the full key path: every unknown key
of a file in one run, a scalar given for a section, a list element's wrong value under its own path.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    InterpolationValidationError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from . import typed_yaml
from .errors import ConfigError
from .schema import STAGE_SECTIONS, RLCoreConfig
from .unknown_keys import unknown_key_problems


@functools.cache
def schema_node(cls: type) -> DictConfig:
    """`cls`'s defaults as OmegaConf's typed node (0.2 s to build for the whole config), built once:
    use it as merge's first argument (merge copies it) or copy it before changing it."""
    node = OmegaConf.structured(cls)
    open_free_dicts(node)
    return node


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def is_section(hint: Any) -> typing.TypeGuard[type]:
    """A schema dataclass (a section or a list item type), as opposed to a scalar or container."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def optional_section(hint: Any) -> type | None:
    """The section of an optional section field (`TasksetConfig | None`), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        sections = [a for a in typing.get_args(hint) if is_section(a)]
        if len(sections) == 1 and type(None) in typing.get_args(hint):
            return sections[0]
    return None


def _type_name(hint: Any) -> str:
    """How a schema type reads in an error message: int, float or null, a list of str..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"a list of {_type_name(args[0])}" if args and args[0] is not Any else "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "a mapping"
    if hint is bool:
        return "true or false"
    return getattr(hint, "__name__", str(hint))


def show(value: Any) -> str:
    """A user value as the YAML/override writer typed it."""
    if value is None:
        return "null"
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    return repr(value)


def _expected_type(err: OmegaConfBaseException) -> str | None:
    """The schema type of the value an OmegaConf ValidationError complains about."""
    obj, key = getattr(err, "object_type", None), getattr(err, "key", None)
    ref = getattr(err, "ref_type", None)
    if is_section(obj) and isinstance(key, str) and key in hints(obj):
        return _type_name(hints(obj)[key])
    if isinstance(key, int) and typing.get_origin(ref) is list:  # a list element
        return _type_name(typing.get_args(ref)[0])
    return None


def explain(err: OmegaConfBaseException, prefix: str = "") -> ConfigError:
    """Turn an OmegaConf exception into a one-line ConfigError with the full key path."""
    rel = getattr(err, "full_key", None) or getattr(err, "key", None) or ""
    key = f"{prefix}{rel}"
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    obj = getattr(err, "object_type", None)
    if isinstance(err, ConfigKeyError) and is_section(obj):
        return ConfigError.of(unknown_key_problems(key, getattr(err, "key", rel), None, list(hints(obj))))
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(f"{key}: required but not set (set it in the YAML or pass {key}=...)")
    if isinstance(err, GrammarParseError):
        return ConfigError(f"{key}: malformed interpolation {show(getattr(err, 'value', None))} ({msg})")
    if isinstance(err, ValidationError) and (expected := _expected_type(err)) is not None:
        source = " (from an interpolation)" if isinstance(err, InterpolationValidationError) else ""
        return ConfigError(f"{key}: expected {expected}, got {show(getattr(err, 'value', None))}{source}")
    if isinstance(err, InterpolationResolutionError):
        return ConfigError(f"{key}: cannot resolve interpolation ({msg})")
    return ConfigError(f"{key}: {msg}" if key else msg)


def layer_problems(cls: type, data: dict[Any, Any], path: str) -> list[str]:
    """A layer's problems with the schema's keys and section shapes, one line each (every unknown
    key of a file in one run), found before OmegaConf merges it.

    OmegaConf names an error inside a list element relative to the element, and reports a scalar
    given for a whole section without any key; walking the layer first keeps the full key path.
    Scalar types are left to OmegaConf (it converts "3" to 3 and resolves interpolations).
    """
    fields = hints(cls)
    problems: list[str] = []
    for key, value in data.items():
        full = f"{path}{key}"
        if key not in fields:
            problems += unknown_key_problems(full, key, value, list(fields))
            continue
        hint = fields[key]
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: checked once resolved
        if optional_section(hint) is not None:
            if value is None:
                continue
            hint = optional_section(hint)
        origin = typing.get_origin(hint)
        if is_section(hint) or origin is dict:
            if not isinstance(value, dict):
                problems.append(f"{full}: expected a mapping of {key} keys, got {show(value)}")
            elif is_section(hint):
                problems += layer_problems(hint, value, full + ".")
        elif origin is list:
            if not isinstance(value, list):
                problems.append(f"{full}: expected {_type_name(hint)}, got {show(value)}")
                continue
            (item_type,) = typing.get_args(hint)
            if is_section(item_type):
                for i, item in enumerate(value):
                    problems += _item_problems(item_type, item, f"{full}[{i}]")
    return problems


def _item_problems(cls: type, item: Any, path: str) -> list[str]:
    if not isinstance(item, dict):
        return [f"{path}: expected a mapping of {cls.__name__} keys, got {show(item)}"]
    problems = layer_problems(cls, item, path + ".")
    if problems or typed_yaml.typed_fields(cls, item):
        return problems
    try:  # scalar types, merged alone so the error can carry the element's path
        OmegaConf.merge(schema_node(cls), item)
    except OmegaConfBaseException as e:
        return str(explain(e, path + ".")).splitlines()
    return []


def stage_problems(stages: Any) -> list[str]:
    """The problems of a recipe's `stages` with their keys, one line each (resolve_stages checks
    the rest, stage by stage)."""
    if not isinstance(stages, list):
        return []
    problems: list[str] = []
    for i, raw in enumerate(stages):
        if not isinstance(raw, dict):
            continue
        for key, value in raw.items():
            path = f"stages[{i}].{key}"
            if key in STAGE_SECTIONS:
                problems += layer_problems(RLCoreConfig, {key: value}, f"stages[{i}].")
            elif key not in hints(RLCoreConfig):
                problems += unknown_key_problems(path, key, value, ["name", *STAGE_SECTIONS])
    return problems


def open_free_dicts(node: DictConfig) -> None:
    """Free-form `dict[str, Any]` fields (e.g. generator_args) accept new keys in every layer;
    struct mode keeps guarding the schema's own sections."""
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if OmegaConf.get_type(child) is dict:
                OmegaConf.set_struct(child, False)
            else:
                open_free_dicts(child)
        elif isinstance(child, ListConfig):
            for item in child:
                if isinstance(item, DictConfig):
                    open_free_dicts(item)
