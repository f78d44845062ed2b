"""The door's streamed events (rollout/openai_stream.py) as the openai SDK's chunk types read them."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletionChunk

from rlcore.rollout.openai_stream import sse_events

CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}
CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny", "policy_version": 3,
    "prompt_token_ids": [1, 2],
    "usage": {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7},
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok", "tool_calls": [CALL]},
         "finish_reason": "tool_calls", "token_ids": [5, 6, 7], "logprobs": None},
        {"index": 1, "message": {"role": "assistant", "content": ""}, "finish_reason": "length",
         "token_ids": [8, 9], "logprobs": None},
    ],
}  # fmt: skip


def _chunks(events: list[str]) -> list[dict]:
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def test_chat_events_carry_content_tool_calls_ids_and_usage() -> None:
    chunks = [ChatCompletionChunk.model_validate(c) for c in _chunks(list(sse_events(CHAT, include_usage=True)))]
    assert chunks[0].model_extra["policy_version"] == 3 and chunks[0].model_extra["prompt_token_ids"] == [1, 2]
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == 7
    first = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == 0]
    assert first[0].delta.role == "assistant" and "".join(c.delta.content or "" for c in first) == "ok"
    (call,) = [d for c in first for d in (c.delta.tool_calls or [])]
    assert (call.index, call.id, call.function.name, call.function.arguments) == (0, "call_1", "calculator", CALL["function"]["arguments"])
    assert [c.finish_reason for c in first if c.finish_reason] == ["tool_calls"]
    assert first[-1].model_extra["token_ids"] == [5, 6, 7]
    empty = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == 1]
    assert [c.finish_reason for c in empty] == [None, "length"]  # no content chunk for an empty reply


def test_completion_events_without_usage() -> None:
    text = {**CHAT, "object": "text_completion", "choices": [
        {"index": 0, "text": "42", "finish_reason": "stop", "token_ids": [4, 2], "logprobs": None}]}  # fmt: skip
    chunks = _chunks(list(sse_events(text, include_usage=False)))  # as the SDK's stream reads them: unvalidated
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "42"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "stop"]
    assert chunks[-1]["choices"][0]["token_ids"] == [4, 2]


def test_text_that_may_still_change_is_held_back() -> None:
    """A trailing piece that may begin a stop string, or a character not fully generated yet, is
    not sent; a stop string found cuts the text before it."""
    from rlcore.rollout.openai_stream import releasable

    assert releasable("the answer is 4", []) == "the answer is 4"
    assert releasable("the answer is 4\n\nQ", ["\n\nQ:"]) == "the answer is 4"
    assert releasable("the answer is 4\n\nQ: next", ["\n\nQ:"]) == "the answer is 4"
    assert releasable("caf\ufffd", []) == "caf"
    assert releasable("a STO", ["STOP", "XY"]) == "a "
    assert releasable("a STOX", ["STOP"]) == "a STOX"


def test_a_live_stream_sends_text_as_it_grows_and_the_rest_once_done() -> None:
    """Tokens in, text deltas out as they become final, then the rest of the finished answer: the
    pieces join to the answer, the first event carries rlcore's fields, the last the finish."""
    import asyncio

    from rlcore.rollout.openai_stream import LiveStream

    async def scenario() -> list[str]:
        live = LiveStream(asyncio.get_running_loop())
        live.begin(chat=True, n=1, model="tiny", prompt_token_ids=[1, 2], policy_version=lambda: 4, include_usage=False,
                   decode=lambda ids: "".join(chr(96 + i) for i in ids), stop=["de"], live=True)  # fmt: skip
        for token in (1, 2, 3, 4):  # a b c d: "d" may begin the stop string "de"
            live.tokens([0], [token])
        live.put(None)
        await asyncio.sleep(0)
        events = []
        while (event := await live.events.get()) is not None:
            events.append(event)
        answer = {**CHAT, "choices": [{"index": 0, "message": {"role": "assistant", "content": "abcd"},
                                       "finish_reason": "length", "token_ids": [1, 2, 3, 4], "logprobs": None}]}  # fmt: skip
        return events + list(live.finish(answer, include_usage=False))

    chunks = [ChatCompletionChunk.model_validate(c) for c in _chunks(asyncio.run(scenario()))]
    assert chunks[0].model_extra["policy_version"] == 4 and chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert pieces == ["a", "b", "c", "d"]  # "d" only once the answer ended without the stop string
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices[0].model_extra["token_ids"] == [1, 2, 3, 4]
    assert len({c.id for c in chunks}) == 1
