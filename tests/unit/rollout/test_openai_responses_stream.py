"""`stream: true` on /v1/responses (rollout/openai_responses_stream.py): the Responses API's events,
as the openai SDK's event types validate them, joining to the response the door builds."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from rlcore.rollout.openai_messages import assistant_message
from rlcore.rollout.openai_responses import response
from rlcore.rollout.openai_responses_stream import ResponsesStream
from rlcore.rollout.workflows.tool_formats import Hermes

EVENTS: TypeAdapter = TypeAdapter(ResponseStreamEvent)
REQUEST = {"model": "tiny", "input": "add them", "tools": [{"type": "function", "name": "add", "parameters": {}}]}
REPLY = 'Sure. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'


def _chat(text: str, finish: str) -> dict:
    """The door's chat completion of `text` (a request with tools)."""
    message = assistant_message(text, Hermes())
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny", "policy_version": 5,
        "prompt_token_ids": [1, 2], "usage": {"prompt_tokens": 2, "completion_tokens": len(text), "total_tokens": 2 + len(text)},
        "choices": [{"index": 0, "message": message, "token_ids": list(range(len(text))), "logprobs": None,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else finish}],
    }  # fmt: skip


def _parsed(events: list[str]) -> list:
    out = []
    for e in events:
        head, data = e.removesuffix("\n\n").split("\n", 1)
        body = json.loads(data.removeprefix("data: "))
        assert head == f"event: {body['type']}"
        out.append(EVENTS.validate_python(body))
    assert [e.sequence_number for e in out] == list(range(len(out)))
    return out


@pytest.mark.parametrize("live", [True, False], ids=["while-generated", "answered-whole"])
def test_a_responses_stream_is_the_response_in_its_events(live: bool) -> None:
    """created, in_progress, the message's text (while generated: before the call's tokens end),
    its done events, the function call as an item, then response.completed with the response the
    door built (its id, model and creation time the ones the stream began with)."""

    async def scenario() -> list[str]:
        stream = ResponsesStream(asyncio.get_running_loop())
        stream.describe({k: v for k, v in REQUEST.items() if k != "model"})  # the request may name no model
        if live:
            stream.begin(chat=True, n=1, model="tiny", prompt_token_ids=[1, 2], policy_version=lambda: 5,
                         include_usage=False, decode=lambda ids: "".join(REPLY[i] for i in ids), stop=[],
                         calls=Hermes())  # fmt: skip
            for i in range(len(REPLY)):
                stream.tokens([0], [i])
            await asyncio.sleep(0)
        sent = []
        while not stream.events.empty():
            sent.append(stream.events.get_nowait())
        out = response(REQUEST, _chat(REPLY, "stop"), stream.response_id)
        return sent + list(stream.finish(out) if live else stream.whole(out))

    events = _parsed(asyncio.run(scenario()))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.function_call_arguments.done" in kinds
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "Sure."
    if live:
        assert len(deltas) == len("Sure.")  # a character a step, while generated
    done = Response.model_validate(events[-1].response.model_dump())
    assert done.id == events[0].response.id and done.output_text == "Sure."
    assert events[0].response.model == done.model == "tiny" and events[0].response.created_at == done.created_at
    (message,) = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "message"]
    assert message.id == done.output[0].id
    (call,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert (call.name, json.loads(call.arguments), call.output_index) == ("add", {"a": 1}, 1)
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]


def test_a_cut_response_ends_incomplete_and_an_error_is_an_error_event() -> None:
    async def scenario() -> tuple[list[str], str]:
        stream = ResponsesStream(asyncio.get_running_loop())
        stream.describe({**REQUEST, "tools": None, "max_output_tokens": 3})
        chat = _chat("abc", "length")
        chat["choices"][0]["message"] = {"role": "assistant", "content": "abc"}
        from rlcore.rollout.openai_errors import DoorError

        return list(stream.whole(response(REQUEST, chat, stream.response_id))), stream.error(DoorError(500, "boom"))

    events, error = asyncio.run(scenario())
    parsed = _parsed(events)
    assert parsed[-1].type == "response.incomplete"
    assert parsed[-1].response.incomplete_details.reason == "max_output_tokens"
    body = json.loads(error.split("data: ", 1)[1])
    assert body["type"] == "error" and body["message"].endswith("boom")
    assert EVENTS.validate_python(body).type == "error"
