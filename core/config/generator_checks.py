"""A taskset's generator_args checked against its generator's own signature (core/data/synthetic.py,
verifiers_tasks.py, or a user's function by import path): the names it takes, the ones it needs,
and the types (a Literal its allowed values), each refused in one line under
`<taskset>.generator_args.<key>` when the config loads, instead of a Python error at launch."""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from ..registry import import_path
from .errors import ConfigError


def check_generator_args(generator: str, args: dict[str, Any], path: str, check_imports: bool) -> None:
    """`path`: the taskset's key. A generator given by import path is imported only with
    `check_imports` (the machine's checks: it may need the run's PYTHONPATH)."""
    from ..data import GENERATORS

    if generator not in GENERATORS and not check_imports:
        return
    try:
        fn = (
            GENERATORS.resolve(generator)
            if generator in GENERATORS
            else import_path(generator, f"{path}.generator")
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_call_args(fn, args, f"{path}.generator_args", f"generator '{generator}'")


def _check_call_args(fn: Callable[..., Any], args: dict[str, Any], path: str, what: str) -> None:
    """`args` as keyword arguments of `fn` after its first (the file it writes), by its signature."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return  # **kwargs: anything goes
    names = [p.name for p in params]
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):  # annotations that do not resolve: names only
        hints = {}
    for key, value in args.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{path}.{key}: not an argument of {what}{guess}; it takes {', '.join(names)}")
        hint = hints.get(key)
        if hint is not None and not _matches(value, hint):
            raise ConfigError(f"{path}.{key}: {what} takes {_describe(hint)}; got {value!r}")
    needed = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in args]
    if needed:
        raise ConfigError(f"{path}.{needed[0]}: required by {what} (it takes {', '.join(names)})")


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(origin or hint, type):
        return isinstance(value, origin or hint)
    return True  # a type this check does not read


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is type(None):
        return "null"
    if hint is bool:
        return "true or false"
    if origin is dict or hint is dict:
        return "a mapping"
    if origin is list or hint is list:
        return "a list"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


_NAMES = {int: "an integer", float: "a number", str: "a string"}
