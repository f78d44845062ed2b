"""Explicit, lazy name -> "module:attr" registries.

Each plug point (training strategies, rollout engines, reward functions, monitors...) declares one
`Registry` in its own package. Entries are strings, so listing names or validating a config never
imports the heavy dependencies of any entry; `resolve` imports exactly the one that was selected.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any


def import_path(path: str, what: str = "object") -> Any:
    """Import `pkg.mod:attr` (or `pkg.mod.attr`) and return the attribute.

    Raises ValueError with a one-line reason when the path is malformed, the module is missing or
    the attribute does not exist.
    """
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{what} '{path}' is not an import path; write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ValueError(f"{what} '{path}': cannot import module '{module_name}' ({e})") from e
    try:
        return getattr(module, attr)
    except AttributeError as e:
        raise ValueError(f"{what} '{path}': module '{module_name}' has no attribute '{attr}'") from e


class Registry(Mapping[str, str]):
    """A read-only mapping name -> "module:attr" that resolves entries on demand."""

    def __init__(self, key_path: str, entries: Mapping[str, str]):
        self.key_path = key_path  # the config key that selects an entry, used in error messages
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> str:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, name: str) -> None:
        if name not in self._entries:
            raise ValueError(f"{self.key_path} must be one of {', '.join(self._entries)}; got '{name}'")

    def resolve(self, name: str) -> Any:
        """Import and return the entry registered under `name`."""
        self.check(name)
        return import_path(self._entries[name], what=self.key_path)

    def resolve_class(self, name: str, base: type, what: str) -> type:
        """A registered class, or a user's subclass of `base` by import path 'pkg.mod:Class'
        (ValueError otherwise, saying what is allowed). `what` names it in messages (tool...)."""
        if name not in self._entries and ":" not in name:
            raise ValueError(
                f"'{name}' is not one of {', '.join(self._entries)} (nor an import path 'pkg.mod:Class')"
            )
        cls = self.resolve(name) if name in self._entries else import_path(name, what=what)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ValueError(
                f"{what} '{name}' is not a {base.__name__} subclass (got {cls!r}); give a class deriving from "
                f"{base.__module__}.{base.__name__}"
            )
        return cls
