"""`stream: true` on the OpenAI-compatible door: a finished response as OpenAI's server-sent events.

The engine returns whole completions (it does not hand out tokens as it decodes), so a streamed
answer arrives once generation ends, as the chunks OpenAI's SDKs reassemble: per choice, the
assistant's role, then its content (and tool calls, each with its index) with the log-probs when
asked, then the finish reason, which carries rlcore's `token_ids`; with stream_options.include_usage
every chunk has `usage: null` but a last one without choices that holds the usage. The first chunk
carries `policy_version` and `prompt_token_ids`, as the whole response does; `data: [DONE]` ends it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def sse_events(response: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """The events of `response` (a chat.completion or text_completion the door built)."""
    chat = response["object"] == "chat.completion"
    base: dict[str, Any] = {
        "id": response["id"], "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response["created"], "model": response["model"],
    }  # fmt: skip
    if include_usage:
        base["usage"] = None
    first = {"policy_version": response["policy_version"], "prompt_token_ids": response["prompt_token_ids"]}
    for choice in response["choices"]:
        for part in _chat_parts(choice) if chat else _text_parts(choice):
            yield _event({**base, **first, "choices": [part]})
            first = {}
    if include_usage:
        yield _event({**base, "choices": [], "usage": response["usage"]})
    yield "data: [DONE]\n\n"


def _chat_parts(choice: dict[str, Any]) -> Iterator[dict[str, Any]]:
    i, message = choice["index"], choice["message"]
    yield {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    delta: dict[str, Any] = {}
    if message.get("content"):
        delta["content"] = message["content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
    if delta:
        yield {"index": i, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
    yield {"index": i, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"],
           "token_ids": choice["token_ids"]}  # fmt: skip


def _text_parts(choice: dict[str, Any]) -> Iterator[dict[str, Any]]:
    i = choice["index"]
    yield {"index": i, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None}
    yield {"index": i, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"],
           "token_ids": choice["token_ids"]}  # fmt: skip


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"
