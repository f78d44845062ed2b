"""OpenAI chat messages in the chat template's terms, a reply back as an OpenAI assistant message,
and the conversations the Responses API stores: what the door's chat completions and the APIs
built on messages share."""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from typing import Any

from .openai_errors import DoorError, invalid
from .workflows.tool_formats import ToolCallFormat


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages (typed by the schema) in the template's terms: text parts joined,
    tool call arguments as objects; the error names the message and field."""
    out = []
    for j, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):  # text parts (the schema serves no other)
            content = "".join(p["text"] for p in content)
        if content is None and not (m["role"] == "assistant" and m.get("tool_calls")):
            raise invalid(f"messages[{j}].content", "is required (only an assistant's tool calls may go without)")
        message: dict[str, Any] = {
            "role": "system" if m["role"] == "developer" else m["role"],
            "content": content or "",
        }
        if m.get("tool_calls"):
            message["tool_calls"] = [
                {"type": "function", "function": {"name": call["function"]["name"],
                                                  "arguments": _arguments(call["function"].get("arguments", "{}"), j, k)}}
                for k, call in enumerate(m["tool_calls"])
            ]  # fmt: skip
        out.append(message)
    return out


def assistant_message(text: str, tool_calls: ToolCallFormat) -> dict[str, Any]:
    """The reply as an OpenAI assistant message: readable tool calls in `tool_calls`, the rest
    (the calls removed) in `content`."""
    calls = [c for c in tool_calls.parse(text) if not isinstance(c, str)]
    if not calls:
        return {"role": "assistant", "content": text}
    content = tool_calls.content(text)
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}
            for name, arguments in calls
        ],
    }  # fmt: skip


def _arguments(arguments: str | dict[str, Any], j: int, k: int) -> dict[str, Any]:
    """A tool call's arguments (OpenAI's JSON text of an object, or the object) as an object."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid(f"messages[{j}].tool_calls[{k}].function.arguments", "must be a JSON object")
    return parsed


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant reply as the agent will send it back (tool call ids dropped, arguments as
    objects), so the next request's messages can be matched against it."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"]["arguments"]),
                },
            }
            for c in message["tool_calls"]
        ]
    return out


STORED = 4096
"""Responses whose conversations a door keeps for `previous_response_id` (the oldest goes first)."""


class Conversations:
    """Stored responses' conversations (chat messages, the reply included), by response id."""

    def __init__(self, limit: int = STORED):
        self.limit = limit
        self._kept: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> list[dict[str, Any]]:
        with self._lock:
            if response_id not in self._kept:
                raise DoorError(404, f"previous_response_id: no stored response '{response_id}' here (a response "
                                "is kept when created with store, and only the newest ones are)",
                                "previous_response_id", "not_found_error")  # fmt: skip
            return list(self._kept[response_id])

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._kept[response_id] = messages
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)
