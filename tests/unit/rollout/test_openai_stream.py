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


REPLY = (
    'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
    '<tool_call>{"name": "mul", "arguments": {"b": 2}}</tool_call> done'
)
"""A reply with text, two hermes calls and text after them; its "tokens" are its characters."""


def _fed(live, reply: str, tools: bool) -> None:
    """Begin `live` as a chat answer and feed it `reply` character by character."""
    from rlcore.rollout.workflows.tool_formats import Hermes

    live.begin(chat=True, n=1, model="tiny", prompt_token_ids=[1], policy_version=lambda: 2, include_usage=False,
               decode=lambda ids: "".join(reply[i] for i in ids), stop=[], calls=Hermes() if tools else None)  # fmt: skip
    for i in range(len(reply)):
        live.tokens([0], [i])


def _drain(live) -> list[str]:
    events = []
    while not live.events.empty():
        events.append(live.events.get_nowait())
    return events


def test_a_chat_stream_with_tools_sends_the_text_before_a_call_and_each_call_once_closed() -> None:
    """The hermes format: content up to the first call marker goes out as it grows (its trailing
    whitespace held back), each call as a tool_calls delta once its closing marker is generated,
    the rest when generation ends: the chunks join to the door's own reply (assistant_message)."""
    import asyncio

    from rlcore.rollout.openai_messages import assistant_message
    from rlcore.rollout.openai_stream import LiveStream
    from rlcore.rollout.workflows.tool_formats import Hermes

    async def scenario() -> tuple[list[str], list[int], dict]:
        live = LiveStream(asyncio.get_running_loop())
        _fed(live, REPLY, tools=True)
        await asyncio.sleep(0)  # the events were queued through the loop
        events = _drain(live)
        calls_at = [i for i, e in enumerate(events) if "tool_calls" in e]
        message = assistant_message(REPLY, Hermes())
        answer = {**CHAT, "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls",
                                       "token_ids": list(range(len(REPLY))), "logprobs": None}]}  # fmt: skip
        return events + list(live.finish(answer, include_usage=False)), calls_at, message

    events, calls_at, message = asyncio.run(scenario())
    chunks = [ChatCompletionChunk.model_validate(c) for c in _chunks(events)]
    assert len(calls_at) == 2  # both calls went out while the reply was generated
    live_content = "".join(c.choices[0].delta.content or "" for c in chunks[: calls_at[0]])
    assert live_content == "Let me add."
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == message["content"] == "Let me add. \n done"
    calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in calls] == [
        (0, "add", {"a": 1}), (1, "mul", {"b": 2})
    ]
    assert all(d.id and d.id.startswith("call_") for d in calls) and calls[0].id != calls[1].id
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


def test_a_chat_stream_with_tools_holds_what_its_content_may_not_begin_with() -> None:
    """A reply beginning with whitespace sends no content until it ends (its content is the reply
    stripped if a call follows, the reply itself if none does); a call never closed is content."""
    import asyncio

    from rlcore.rollout.openai_messages import assistant_message
    from rlcore.rollout.openai_stream import LiveStream
    from rlcore.rollout.workflows.tool_formats import Hermes

    for reply in (" 4 <tool_call>{}", "4 <tool_call>{\"name\": \"add\""):

        async def scenario(reply: str = reply) -> list[str]:
            live = LiveStream(asyncio.get_running_loop())
            _fed(live, reply, tools=True)
            await asyncio.sleep(0)
            message = assistant_message(reply, Hermes())
            answer = {**CHAT, "choices": [{"index": 0, "message": message, "finish_reason": "length",
                                           "token_ids": [1], "logprobs": None}]}  # fmt: skip
            return _drain(live) + list(live.finish(answer, include_usage=False))

        chunks = [ChatCompletionChunk.model_validate(c) for c in _chunks(asyncio.run(scenario()))]
        content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(content) == reply  # no readable call: the reply is the content
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
        if reply.startswith(" "):
            assert len(content) == 1  # all of it at the end


def test_streamed_content_and_calls_join_to_the_reply_for_any_split_of_any_reply() -> None:
    """Seeded random hermes replies (text, whitespace, readable, malformed and unclosed calls, text
    between calls, stop strings) fed in random pieces: the content deltas join to the door's reply
    content and the calls streamed live plus those sent at the end are its calls, in order, once
    each; a reply whose first output is a call counts as its first text (time to first token)."""
    import asyncio
    import random

    from rlcore.rollout.openai_messages import assistant_message
    from rlcore.rollout.openai_stream import LiveStream
    from rlcore.rollout.workflows.tool_formats import Hermes

    pieces = ["ok", " ", "\n", "<tool_call>", "</tool_call>", '{"name": "f", "arguments": {"x": 1}}', "{bad",
              "<tool", "STOP", "</", "é"]  # fmt: skip
    rng = random.Random(0)
    for _ in range(300):
        reply = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))
        stop = rng.choice([[], ["STOP"], ["</tool_call>"]])

        async def scenario(reply: str = reply, stop: list[str] = stop) -> tuple[list[str], LiveStream, dict]:
            live = LiveStream(asyncio.get_running_loop())
            live.begin(chat=True, n=1, model="tiny", prompt_token_ids=[1], policy_version=lambda: 0, include_usage=False,
                       decode=lambda ids: "".join(reply[i] for i in ids), stop=stop, calls=Hermes())  # fmt: skip
            i = 0
            while i < len(reply):
                step = list(range(i, min(i + rng.randint(1, 5), len(reply))))
                live.tokens([0] * len(step), step)
                i = step[-1] + 1
            await asyncio.sleep(0)
            cuts = [reply.find(s) for s in stop if s in reply]
            message = assistant_message(reply[: min(cuts)] if cuts else reply, Hermes())  # the engine's text
            answer = {**CHAT, "choices": [{"index": 0, "message": message, "finish_reason": "stop",
                                           "token_ids": [1], "logprobs": None}]}  # fmt: skip
            return _drain(live) + list(live.finish(answer, include_usage=False)), live, message

        events, live, message = asyncio.run(scenario())
        chunks = [ChatCompletionChunk.model_validate(c) for c in _chunks(events)]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert content == (message["content"] or ""), (reply, stop)
        calls = [(d.index, d.function.name, d.function.arguments) for c in chunks if c.choices
                 for d in (c.choices[0].delta.tool_calls or [])]  # fmt: skip
        expected = [(k, t["function"]["name"], t["function"]["arguments"]) for k, t in enumerate(message.get("tool_calls") or [])]
        assert calls == expected, (reply, stop)
        if live.calls_sent[0] or live.sent[0]:
            assert live.first_text_s is not None
