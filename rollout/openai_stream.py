"""`stream: true` on the OpenAI-compatible door: an answer as OpenAI's server-sent events, its text
sent while the engine generates it.

Where the worker's engine has a running batch (the HF engine on CPU: engines/hf_running.py), the
engine hands each step's tokens to a `LiveStream`: the first events are the assistant's role (chat),
then each choice's text as it grows. Text that could still change is held back: a trailing
character whose bytes are not all generated yet, and a trailing piece that may be the start of a
stop string (the answer is cut before a stop string). Once generation ends, the rest goes out as
the chunks OpenAI's SDKs reassemble (`sse_events`): per choice, the text not yet sent (and tool
calls, each with its index) with the log-probs when asked, then the finish reason, which carries
rlcore's `token_ids`; with stream_options.include_usage every chunk has `usage: null` but a last one
without choices that holds the usage. The first chunk carries `policy_version` and
`prompt_token_ids`, as the whole response does; `data: [DONE]` ends it.

A chat request with `tools`, where the model writes its calls between markers (the `hermes` format:
Qwen's, Hermes'), streams the reply's text up to its first call marker and each call as one
`tool_calls` delta as soon as its closing marker is generated (its id, name and whole arguments);
the rest of the reply's text goes out when generation ends, as it must match the reply's content
(which drops the calls and the whitespace around the text). With other tool-call formats (a reply
is a call only once it is whole) the reply goes out when generation ends, as with an engine without
a running batch (vLLM in process, a GPU's CUDA-graph decode).

Subclasses say the same answer in another API's events (openai_responses_stream.py): the hooks
`_opened`, `_text` and `_call` and the methods `finish`, `whole` and `error`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .openai_errors import DoorError
    from .workflows.tool_formats import ToolCallFormat


class LiveStream:
    """One streamed answer's events while it is generated. The door calls `begin` once the
    request is accepted and the engine's loop thread calls `tokens` after each step; the web layer
    reads `events` (an asyncio queue of event texts, None once the door is done with the request)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self.events: asyncio.Queue[str | None] = asyncio.Queue()
        self.begun = False
        self.sent: list[str] = []
        """Each choice's text sent so far."""
        self._tokens: list[list[int]] = []
        self._base: dict[str, Any] = {}
        self.first: dict[str, Any] = {}
        """The fields the stream's first event carries, until it is sent."""
        self._start = time.perf_counter()
        self._started = False
        self.first_text_s: float | None = None
        """When the answer's first text went out, in seconds after the stream began."""
        self._decode: Callable[[list[int]], str] = lambda ids: ""
        self._stop: list[str] = []
        self._live = self._chat = False
        self._version: Callable[[], int] = lambda: 0
        self._text: list[str] = []
        self._offsets: list[tuple[int, int]] = []
        self._calls: ToolCallFormat | None = None
        self.calls_sent: list[list[dict[str, Any]]] = []
        """Each choice's tool calls sent so far (live, with `tools`)."""
        self._clear: list[int] = []
        """Per choice: the length of the text released last (it holds no stop string)."""
        self._held: list[bool] = []
        """Per choice, with tools: whether its content waits for the end (a call marker came, or
        it begins with whitespace)."""
        self._scanned: list[int] = []
        """Per choice, with tools: where its last closed call ends in its text."""

    @property
    def started(self) -> bool:
        """Whether its first events went out (the engine handed it tokens)."""
        return self._started

    def put(self, event: str | None) -> None:
        """Queue an event from any thread (None: no more events from the door)."""
        self._loop.call_soon_threadsafe(self.events.put_nowait, event)

    def begin(
        self, *, chat: bool, n: int, model: str, prompt_token_ids: list[int] | list[list[int]],
        policy_version: Callable[[], int], include_usage: bool, decode: Callable[[list[int]], str],
        stop: list[str], live: bool = True, calls: ToolCallFormat | None = None,
    ) -> None:  # fmt: skip
        """The answer is accepted; its first events go out with its first tokens (chat: each
        choice's role; the first carries the version of the weights generating, `policy_version()`
        then). `live`: whether its text is sent as it grows (else all of it when generation ends);
        `calls`: the tool-call format of a request with tools (its text goes out as it grows only if
        the format marks where a call begins, and its calls as each is closed)."""
        self._live = live and (calls is None or calls.MARKER is not None)
        self.begun, self._chat, self._version, self._calls = True, chat, policy_version, calls
        self.sent, self._tokens = [""] * n, [[] for _ in range(n)]
        self.calls_sent = [[] for _ in range(n)]
        self._clear, self._held, self._scanned = [0] * n, [False] * n, [0] * n
        self._text, self._offsets = [""] * n, [(0, 0)] * n
        self._decode, self._stop = decode, stop
        self._base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model,
        }  # fmt: skip
        if include_usage:
            self._base["usage"] = None
        self.first = {"prompt_token_ids": prompt_token_ids}

    def tokens(self, rows: list[int], tokens: list[int]) -> None:
        """Rows `rows` sampled `tokens` (the engine's loop thread): send the text that is final."""
        if not self._started:
            self._started = True
            self.first = {"policy_version": self._version(), **self.first}
            self._opened()
        for row, token in zip(rows, tokens, strict=True):
            self._tokens[row].append(token)
        if not self._live:
            return
        for row in sorted(set(rows)):
            self._grow(row)
            sent, looked = self.sent[row], self._clear[row]
            text = releasable(self._text[row], self._stop, start=looked)
            self._clear[row] = len(text)
            content = text if self._calls is None else self._content(row, text)
            if len(content) > len(sent):
                self.sent[row] = content
                self._first_out()
                self._text_delta(row, content[len(sent) :])
            if self._calls is not None and self.STREAMS_CALLS:
                self._closed_calls(row, text, looked)

    STREAMS_CALLS = True
    """Whether tool calls go out as each is closed (else with the rest, when generation ends)."""

    def _first_out(self) -> None:
        if self.first_text_s is None:
            self.first_text_s = time.perf_counter() - self._start

    def _content(self, row: int, text: str) -> str:
        """The part of row `row`'s reply (with tools) that its content (the reply without its calls,
        stripped) begins with whatever comes next: the text before the first call marker (or a
        trailing piece of one), without trailing whitespace; none while the reply begins with
        whitespace (its content is the reply itself if no call follows, else the reply stripped).
        Final once a marker came: the rest goes out when generation ends."""
        marker, sent = self._calls.MARKER if self._calls is not None else None, self.sent[row]
        assert marker is not None
        if self._held[row]:
            return sent
        if text[:1].isspace():
            self._held[row] = True
            return ""
        if (at := text.find(marker, max(0, len(sent) - len(marker)))) >= 0:
            self._held[row] = True
            return text[:at].rstrip()
        return releasable(text, [marker], start=len(sent)).rstrip()

    def _closed_calls(self, row: int, text: str, looked: int) -> None:
        """Send row `row`'s calls closed in `text` since the last one (`looked`: the length of the
        text looked at before), each as it will be in the reply (its readable calls, in order)."""
        assert self._calls is not None and self._calls.CLOSE is not None
        scanned = self._scanned[row]
        if text.find(self._calls.CLOSE, max(scanned, looked - len(self._calls.CLOSE))) < 0:
            return
        found, end = self._calls.closed(text[scanned:])
        self._scanned[row] = scanned + end
        for name, arguments in (c for c in found if not isinstance(c, str)):
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
            self.calls_sent[row].append(call)
            self._first_out()
            self._call(row, len(self.calls_sent[row]) - 1, call)

    # the events of chat.completion.chunk and text_completion; other APIs' streams override these

    def _opened(self) -> None:
        """The first tokens came: chat sends each choice's role (a completion's first event is its text)."""
        if self._chat:
            for i in range(len(self.sent)):
                self._send({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})  # fmt: skip

    def _text_delta(self, row: int, delta: str) -> None:
        part = {"index": row, "delta": {"content": delta}} if self._chat else {"index": row, "text": delta}
        self._send({**part, "logprobs": None, "finish_reason": None})

    def _call(self, row: int, index: int, call: dict[str, Any]) -> None:
        self._send({"index": row, "delta": {"tool_calls": [{"index": index, **call}]}, "logprobs": None,
                    "finish_reason": None})  # fmt: skip

    def _grow(self, row: int) -> None:
        """Row `row`'s text with its new tokens, decoding only the last few (a window from the last
        token whose text was whole): the text of a token may depend on the one before it, and a
        character's bytes may span tokens (then the text waits for the rest)."""
        ids, (prefix, read) = self._tokens[row], self._offsets[row]
        before = self._decode(ids[prefix:read])
        now = self._decode(ids[prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._text[row] += now[len(before) :]
            self._offsets[row] = (read, len(ids))

    def _send(self, choice: dict[str, Any]) -> None:
        self.put(_event({**self._base, **self.first, "choices": [choice]}))
        self.first = {}

    def finish(self, response: dict[str, Any], include_usage: bool) -> Iterator[str]:
        """The events after those sent: the rest of `response` (the answer the door built)."""
        same = {k: self._base[k] for k in ("id", "created", "model")}
        return sse_events({**response, **same}, include_usage, self)

    def whole(self, response: dict[str, Any], include_usage: bool) -> Iterator[str]:
        """The events of `response`, answered before any was sent (an engine without a running batch)."""
        return sse_events(response, include_usage)

    def error(self, e: DoorError) -> str:
        """The event that ends a stream that failed after it began."""
        return _event(e.body())


def releasable(text: str, stop: list[str], start: int = 0) -> str:
    """The part of `text` (a reply decoded so far) that stays as it is whatever is generated next:
    cut before a stop string it holds, without a trailing piece that may begin one, or a trailing
    character whose bytes are not all there yet (decoded as U+FFFD). `start`: text[:start] holds
    no stop string (it was released before), so the search begins just before it."""
    since = max(0, start - max((len(s) for s in stop), default=0))
    cuts = [i for i in (text.find(s, since) for s in stop) if i >= 0]
    if cuts:
        return text[: min(cuts)]
    keep = len(text.rstrip("\ufffd"))
    for s in stop:
        for k in range(min(len(s) - 1, keep), 0, -1):
            if text[:keep].endswith(s[:k]):
                keep -= k
                break
    return text[:keep]


def sse_events(response: dict[str, Any], include_usage: bool, live: LiveStream | None = None) -> Iterator[str]:
    """The events of `response` (a chat.completion or text_completion the door built); after a
    `live` stream's events, only what it has not sent."""
    chat = response["object"] == "chat.completion"
    base: dict[str, Any] = {
        "id": response["id"], "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response["created"], "model": response["model"],
    }  # fmt: skip
    if include_usage:
        base["usage"] = None
    first = {"policy_version": response["policy_version"], "prompt_token_ids": response["prompt_token_ids"]}
    started = live is not None and live.started
    if started and live is not None and not live.first:
        first = {}  # the live events carried them
    for choice in response["choices"]:
        sent = live.sent[choice["index"]] if started and live is not None else ""
        calls = len(live.calls_sent[choice["index"]]) if started and live is not None else 0
        parts = _chat_parts(choice, sent, calls, not started) if chat else _text_parts(choice, sent)
        for part in parts:
            yield _event({**base, **first, "choices": [part]})
            first = {}
    if include_usage:
        yield _event({**base, "choices": [], "usage": response["usage"]})
    yield "data: [DONE]\n\n"


def _rest(text: str, sent: str) -> str:
    """`text` without the part a live stream sent; nothing where the two part ways (what was sent
    cannot be taken back, and sending it all again would repeat it)."""
    return text[len(sent) :] if text.startswith(sent) else ""


def _chat_parts(choice: dict[str, Any], sent: str, calls_sent: int, role: bool) -> Iterator[dict[str, Any]]:
    i, message = choice["index"], choice["message"]
    if role:
        yield {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    delta: dict[str, Any] = {}
    if rest := _rest(message.get("content") or "", sent):
        delta["content"] = rest
    if calls := [{"index": k, **call} for k, call in enumerate(message.get("tool_calls") or []) if k >= calls_sent]:
        delta["tool_calls"] = calls
    if delta or choice["logprobs"]:
        yield {"index": i, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
    yield {"index": i, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"],
           "token_ids": choice["token_ids"]}  # fmt: skip


def _text_parts(choice: dict[str, Any], sent: str) -> Iterator[dict[str, Any]]:
    i = choice["index"]
    rest = _rest(choice["text"], sent)
    if rest or choice["logprobs"] or not sent:
        yield {"index": i, "text": rest, "logprobs": choice["logprobs"], "finish_reason": None}
    yield {"index": i, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"],
           "token_ids": choice["token_ids"]}  # fmt: skip


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"
