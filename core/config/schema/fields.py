"""How a schema field declares what validation checks (validate.py reads the metadata)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def choice(default: Any, choices: tuple[str, ...] | str) -> Any:
    return field(default=default, metadata={"choices": choices})


def bounded(default: Any, **bounds: float) -> Any:
    return field(default=default, metadata=bounds)
