"""`/v1/responses` on the door: the Responses API's common subset (what the OpenAI Agents SDK and
NeMo Gym send), served as a chat completion of the same conversation.

A request becomes chat messages: `instructions` as the system message, the conversation a stored
`previous_response_id` ended with, then the `input` (a string is one user message; message items
as messages, their text parts joined; `function_call` items as the assistant's tool calls, those in
a row as one turn; `function_call_output` items as tool messages). Function tools become chat tools.
The door's chat completion answers it (the same template, engine, limits and episode recording: an
`episode_id` records the turns as a chat episode, and a follow-up that sends the conversation on,
by `previous_response_id` or in full, continues it). Its reply becomes the output items: the text
as a message item, each tool call as a function_call item. With `store` (the default) the
conversation is kept under the response's id, for a later `previous_response_id`, in memory, the
newest openai_messages.STORED of them.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from .openai_errors import DoorError, invalid

if TYPE_CHECKING:
    from .openai_door import OpenAIDoor
    from .openai_responses_stream import ResponsesStream


def chat_request(body: dict[str, Any], earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion request of a (checked) Responses request whose stored conversation so
    far is `earlier`."""
    messages = list(earlier)
    if body.get("instructions") is not None:  # this request's, in place of an earlier one's
        messages = [m for m in messages if m["role"] != "system"]
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    items = body["input"]
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items:
        kind = item.get("type") or "message"
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"] = [*last["tool_calls"], call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            messages.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
    chat: dict[str, Any] = {"messages": messages}
    if body.get("tools"):
        chat["tools"] = [
            {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}}
            for t in body["tools"]
        ]  # fmt: skip
    verbosity = (body.get("text") or {}).get("verbosity")
    if verbosity not in (None, "medium"):
        raise invalid("text.verbosity", f"'{verbosity}' is not served: a model answers at its own length ('medium'); drop it")
    fmt = (body.get("text") or {}).get("format")
    if fmt is not None:
        chat["response_format"] = {"type": fmt["type"]}
        if fmt["type"] == "json_schema":
            chat["response_format"]["json_schema"] = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    for key, chat_key in (("model", "model"), ("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed"),
                          ("max_output_tokens", "max_tokens"), ("tool_choice", "tool_choice"), ("user", "user"),
                          ("episode_id", "episode_id")):  # fmt: skip
        if body.get(key) is not None:
            chat[chat_key] = body[key]
    return chat


CHAT_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
"""A chat parameter an error names, as the Responses request calls it."""


def as_responses_error(e: DoorError) -> DoorError:
    """A chat completion's error in the Responses request's terms: `messages...` is the `input`
    (its indices are the conversation's, not the input's), `max_tokens` the `max_output_tokens`,
    `response_format` the `text.format`."""
    param = e.param or ""
    head = next((p for p in CHAT_PARAMS if param == p or param.startswith((f"{p}[", f"{p}."))), None)
    if head is None:
        return e
    message = str(e).split(": ", 1)[1] if ": " in str(e) else str(e)
    return DoorError(e.status, f"{CHAT_PARAMS[head]}: {message}", CHAT_PARAMS[head], e.kind)


def response(body: dict[str, Any], chat: dict[str, Any], response_id: str | None = None) -> dict[str, Any]:
    """The Responses API's response object for the chat completion `chat` answering `body` (its id
    `response_id`, or a new one)."""
    choice = chat["choices"][0]
    message, output = choice["message"], []
    if message.get("content"):
        output.append({
            "type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
        })  # fmt: skip
    for call in message.get("tool_calls") or []:
        output.append({
            "type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"], "status": "completed",
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
        })  # fmt: skip
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": response_id or f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": time.time(), "model": chat["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "instructions": body.get("instructions"), "previous_response_id": body.get("previous_response_id"),
        "output": output, "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": True, "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {},
        "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled", "store": body.get("store") is not False,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "policy_version": chat["policy_version"], "prompt_token_ids": chat["prompt_token_ids"],
        "token_ids": choice["token_ids"],
    }  # fmt: skip


def reply_message(chat: dict[str, Any]) -> dict[str, Any]:
    """The chat reply as the conversation keeps it (tool calls with their ids, arguments as text)."""
    message = chat["choices"][0]["message"]
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
                                                             "arguments": c["function"]["arguments"]}}
            for c in message["tool_calls"]
        ]  # fmt: skip
    return kept


def serve(
    door: OpenAIDoor, body: dict[str, Any], episode_header: str | None, live: ResponsesStream | None = None
) -> dict[str, Any]:
    """POST /v1/responses: `body` answered by the door's chat completion of its conversation
    (streamed through `live` with stream: true)."""
    door.check_body("responses", body)
    earlier = door.conversations.get(body["previous_response_id"]) if body.get("previous_response_id") else []
    chat = chat_request(body, earlier)
    if live is not None:
        live.describe(body)
    try:
        answer = door.chat(chat, episode_header, live)
    except DoorError as e:
        raise as_responses_error(e) from None
    out = response(body, answer, live.response_id if live is not None else None)
    if body.get("store") is not False:
        door.conversations.put(out["id"], [*chat["messages"], reply_message(answer)])
    return out
