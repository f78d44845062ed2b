"""A config dataclass to YAML and back without OmegaConf, for the hand-offs inside a run (a launch's
stage configs to its trainer ranks, a trainer service's Configure). OmegaConf builds a typed node
for every field (0.1-0.4 s a stage config, paid in the launcher and again in every rank); here the
text is libyaml's and the dataclasses are built from their annotations.

`dump` writes the text OmegaConf.to_yaml writes for the same config (a test compares them on every
recipe). `load` builds only what is already exactly typed (every field's key there and no other, every value
of its field's type) and says None otherwise: the caller then takes OmegaConf's path, which converts or
refuses with its one-line error, so a text reads as it did before.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(cfg: Any) -> str | None:
    """A config dataclass as the YAML OmegaConf.to_yaml writes for it; None where a value is of a
    type YAML's safe dumper does not write (the caller takes OmegaConf's path)."""
    try:
        return str(
            yaml.dump(
                dataclasses.asdict(cfg),
                Dumper=_Dumper,
                default_flow_style=False,
                allow_unicode=True,
                sort_keys=False,
            )
        )
    except yaml.representer.RepresenterError:
        return None


def load(cls: type[T], text: str) -> T | None:
    """`cls` built from `text` when the text is exactly typed for it, else None."""
    data = yaml.load(text, Loader=_Loader)
    try:
        return _build(cls, data)
    except _Untyped:
        return None


def typed_fields(cls: type, data: Any) -> bool:
    """Whether `data` sets only fields of `cls`, each to a value already exactly of the field's type
    (a section fully written out), which OmegaConf would take as it is; the fields it leaves out keep
    their defaults. False says nothing: OmegaConf's merge then converts or refuses."""
    if not isinstance(data, dict):
        return False
    fields = _fields(cls)
    try:
        for name, value in data.items():
            if name not in fields:
                return False
            section = section_of(fields[name])
            if section is not None and isinstance(value, dict):
                if not typed_fields(section, value):  # a section partly written: its own fields
                    return False
            else:
                _value(fields[name], value)
    except _Untyped:
        return False
    return True


def section_of(tp: Any) -> Any:
    """The dataclass of a section field's type (`X` or `X | None`), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else None
    return tp if dataclasses.is_dataclass(tp) else None


class _Untyped(Exception):
    """A key that is no field, or a value not of its field's type."""


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _build(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        raise _Untyped
    fields = _fields(cls)
    if data.keys() != fields.keys():  # every field written (dump writes all): no default fills in
        raise _Untyped
    return cls(**{name: _value(fields[name], value) for name, value in data.items()})


def _value(tp: Any, value: Any) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)] or [None]
        if inner is None:
            raise _Untyped
        return _value(inner, value)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp) or (Any,)
        return [_value(item, v) for v in value]
    if origin is dict and isinstance(value, dict):
        key, item = typing.get_args(tp) or (Any, Any)
        if key is not Any and not all(isinstance(k, key) for k in value):
            raise _Untyped
        return {k: _value(item, v) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise _Untyped
    if isinstance(tp, type) and origin is None and isinstance(value, tp):
        return value
    raise _Untyped
