"""Tools for the `tool_call` workflow (tools/base.py: Tool), by registered name or import path."""

from __future__ import annotations

from ...core.registry import Registry
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
    return TOOLS.resolve_class(name, Tool, "tool")
