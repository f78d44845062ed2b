"""The Tool interface behind the `tool_call` workflow: a function the model may call by name with
JSON arguments, declared to it as an OpenAI function schema."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class ToolError(Exception):
    """A call the tool refuses or fails (bad arguments, an error in the code it ran, a timeout):
    the model reads the message as the tool's output, the episode goes on."""


class Tool(ABC):
    """Built once per workflow as `Tool(args)` (`args`: the tool's entry in `workflow_args.tool_args`,
    JSON values). A user's tool is a subclass named by import path in `workflow_args.tools`."""

    name: str
    """What the model calls it by."""
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""

    def __init__(self, args: dict[str, Any] | None = None):
        self.args = dict(args or {})

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema the chat template declares to the model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @abstractmethod
    def __call__(self, arguments: dict[str, Any]) -> str:
        """The tool's output as text (raise ToolError for a call it cannot serve)."""

    @staticmethod
    def required_str(arguments: dict[str, Any], key: str) -> str:
        value = arguments.get(key)
        if not isinstance(value, str):
            raise ToolError(f"argument '{key}' must be a string; got {value!r}")
        return value
