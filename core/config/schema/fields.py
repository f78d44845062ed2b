"""How a schema field declares what validation checks (validate.py reads the metadata)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def choice(default: Any, choices: tuple[str, ...] | str, by_path: bool = False) -> Any:
    """One of `choices` (a tuple, or "module:REGISTRY"); `by_path`: also an import path 'pkg.mod:attr'
    (the plug point checks what it names)."""
    return field(default=default, metadata={"choices": choices, "by_path": by_path})


def bounded(default: Any, **bounds: float) -> Any:
    return field(default=default, metadata=bounds)
