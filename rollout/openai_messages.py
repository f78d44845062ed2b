"""OpenAI chat messages in the chat template's terms, and a reply back as an OpenAI assistant
message: what the door's chat completions (and any API built on messages) share."""

from __future__ import annotations

import json
import uuid
from typing import Any

from .openai_errors import invalid
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
