"""`stream: true` on `/v1/responses`: the answer as the Responses API's events (`event: <type>` and
its JSON, each with a `sequence_number`), its text sent while the engine generates it.

The chat completion serving the request streams through this LiveStream (openai_stream.py decides
what text is final, here only how it is said): once the engine hands out the first tokens,
`response.created` and `response.in_progress` (the response in progress, with the version of the
weights generating); with the first text, the message item and its output_text part; then each
piece of text as `response.output_text.delta`. When generation ends: the rest of the text, the
message's `done` events, each function call as an item (`added`, its arguments as one delta,
`done`; calls go out here, after the message, as the response lists them), and the whole response
(`response.completed`, or `response.incomplete` when max_output_tokens cut it), whose message id is
the one streamed.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .openai_errors import DoorError
from .openai_stream import LiveStream


class ResponsesStream(LiveStream):
    """One Responses answer's events while it is generated (one choice)."""

    STREAMS_CALLS = False
    """Calls go out when generation ends, after the message (the response's order)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._seq = 0
        self.response_id = f"resp_{uuid.uuid4().hex}"
        self._message_id = f"msg_{uuid.uuid4().hex}"
        self._message_open = False
        self._skeleton: dict[str, Any] = {}
        """The response in progress (the request's echo; set when the door has checked the request)."""
        self.created_at = time.time()

    def describe(self, request: dict[str, Any]) -> None:
        """The checked Responses request, which the in-progress response echoes."""
        self._skeleton = {
            "id": self.response_id, "object": "response", "status": "in_progress", "model": request.get("model"),
            "instructions": request.get("instructions"), "previous_response_id": request.get("previous_response_id"),
            "output": [], "tools": request.get("tools") or [], "tool_choice": request.get("tool_choice") or "auto",
            "parallel_tool_calls": True, "temperature": request.get("temperature"), "top_p": request.get("top_p"),
            "max_output_tokens": request.get("max_output_tokens"), "metadata": request.get("metadata") or {},
            "text": request.get("text") or {"format": {"type": "text"}}, "truncation": "disabled", "store": request.get("store") is not False,
            "error": None, "incomplete_details": None, "usage": None,
        }  # fmt: skip

    def _event(self, kind: str, **fields: Any) -> str:
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self._seq - 1, **fields})}\n\n"

    def _opened(self) -> None:
        for event in self._began(self.first.get("policy_version")):
            self.put(event)
        self.first = {}

    def _began(self, version: int | None) -> Iterator[str]:
        progress = {**self._skeleton, "created_at": self.created_at, "policy_version": version}
        if progress.get("model") is None:  # the request named none: the model serving it
            progress["model"] = self._base.get("model")
        yield self._event("response.created", response=progress)
        yield self._event("response.in_progress", response=progress)

    def _open_message(self) -> Iterator[str]:
        if self._message_open:
            return
        self._message_open = True
        item = {"type": "message", "id": self._message_id, "status": "in_progress", "role": "assistant", "content": []}
        yield self._event("response.output_item.added", output_index=0, item=item)
        yield self._event("response.content_part.added", item_id=self._message_id, output_index=0, content_index=0,
                          part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip

    def _text_delta(self, row: int, delta: str) -> None:
        for event in self._open_message():
            self.put(event)
        self.put(self._event("response.output_text.delta", item_id=self._message_id, output_index=0, content_index=0,
                             delta=delta, logprobs=[]))  # fmt: skip

    def finish(self, response: dict[str, Any], include_usage: bool = False) -> Iterator[str]:
        """The events after those sent: the rest of `response` (the Responses object the door built)."""
        response = copy.deepcopy(response)
        response["created_at"] = self.created_at
        message = next((item for item in response["output"] if item["type"] == "message"), None)
        if self._message_open and message is None:  # cannot be: the text sent begins the reply's content
            yield self.error(DoorError(500, "the streamed text is not the reply's (a bug: the worker's log has the reply)"))
            return
        index = 0
        if message is not None:
            message["id"] = self._message_id
            yield from self._open_message()
            text = message["content"][0]["text"]
            sent = self.sent[0] if self.sent else ""
            if text.startswith(sent) and len(text) > len(sent):
                yield self._event("response.output_text.delta", item_id=self._message_id, output_index=0,
                                  content_index=0, delta=text[len(sent) :], logprobs=[])  # fmt: skip
            part = message["content"][0]
            yield self._event("response.output_text.done", item_id=self._message_id, output_index=0, content_index=0,
                              text=text, logprobs=[])  # fmt: skip
            yield self._event("response.content_part.done", item_id=self._message_id, output_index=0, content_index=0,
                              part=part)  # fmt: skip
            yield self._event("response.output_item.done", output_index=0, item=message)
            index = 1
        for item in response["output"][index:]:
            started = {**item, "arguments": "", "status": "in_progress"}
            yield self._event("response.output_item.added", output_index=index, item=started)
            yield self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                              delta=item["arguments"])  # fmt: skip
            yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])  # fmt: skip
            yield self._event("response.output_item.done", output_index=index, item=item)
            index += 1
        done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield self._event(done, response=response)

    def whole(self, response: dict[str, Any], include_usage: bool = False) -> Iterator[str]:
        """The events of `response`, answered before any was sent (an engine without a running batch)."""
        if not self._skeleton:
            self._skeleton = {k: v for k, v in response.items() if k not in ("output", "usage", "token_ids")}
            self._skeleton.update(status="in_progress", output=[], usage=None, incomplete_details=None)
            self.created_at = response["created_at"]
        self._skeleton["model"] = self._skeleton.get("model") or response["model"]
        yield from self._began(response.get("policy_version"))
        yield from self.finish(response)

    def error(self, e: DoorError) -> str:
        """The `error` event that ends a stream that failed after it began."""
        body = e.body()["error"]
        return self._event("error", code=body.get("code") or body.get("type"), message=body["message"],
                           param=body.get("param"))  # fmt: skip
