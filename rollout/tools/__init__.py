"""Tools for the `tool_call` workflow (tools/base.py: Tool), by registered name or import path."""

from __future__ import annotations

from ...core.registry import Registry, import_path
from .base import Tool

TOOLS = Registry(
    "workflow_args.tools",
    {
        "calculator": "rlcore.rollout.tools.calculator:Calculator",
        "python": "rlcore.rollout.tools.python:PythonTool",
    },
)


def resolve_tool(name: str) -> type[Tool]:
    """A registered tool, or a Tool subclass by import path (ValueError otherwise)."""
    if name not in TOOLS and ":" not in name:
        raise ValueError(f"'{name}' is not one of {', '.join(TOOLS)} (nor an import path 'pkg.mod:Class')")
    cls = TOOLS.resolve(name) if name in TOOLS else import_path(name, what="tool")
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ValueError(
            f"tool '{name}' is not a Tool subclass (got {cls!r}); give a class deriving from "
            "rlcore.rollout.tools.base.Tool"
        )
    return cls
