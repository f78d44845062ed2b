"""How a model writes its tool calls, read back from a reply: one small class per format.

- `hermes` (Qwen, Hermes and their fine-tunes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  any number of them among text;
- `llama3_json` (Llama 3.1-3.3's JSON tool calling): the whole reply is a call
  `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` when the tokenizer keeps it), or
  several separated by `;`;
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (v3 tokenizers); the marker
  is a special token that the engines' decoding drops, so a reply that is such a list reads the
  same. (`[TOOL_CALLS]name[ARGS]{...}`, v11 and later, is read only where the markers reach the
  text: both are special tokens there, which decoding drops);
- `response_template`: the tokenizer's own parser (`tokenizer.parse_response`, transformers'
  declarative response templates), for tokenizers that declare one.

`auto` (the default) picks the tokenizer's response template when it has one, else the format its
chat template renders tool calls in (`resolve`). Each call is (name, arguments), or an error message
for a call that cannot be read (the model reads it in its tool turn); arguments may be an object or
a JSON string of one (OpenAI's form).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any

ToolCall = tuple[str, dict[str, Any]] | str
"""(name, arguments), or why a call could not be read."""


def _call(value: Any, arguments_key: str = "arguments") -> ToolCall:
    """A parsed call object as (name, arguments), or the error a model can act on."""
    if not isinstance(value, dict):
        return f'malformed tool call: give {{"name": "<tool>", "{arguments_key}": {{...}}}}'
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(value.get("name"), str) or not isinstance(arguments, dict):
        return f'malformed tool call: give {{"name": "<tool>", "{arguments_key}": {{...}}}}'
    return value["name"], arguments


def _not_json(body: str, e: json.JSONDecodeError) -> str:
    return f"malformed tool call: not JSON ({e.msg} at character {e.pos}): {body.strip()[:200]}"


class ToolCallFormat(ABC):
    name = ""
    MARKER: str | None = None
    """The text each call begins with, where calls are written among text (a stream can send the
    text before it, and each call once closed: `closed`); None: a reply is read as calls only once
    whole."""
    CLOSE: str | None = None
    """The text each call ends with (with MARKER)."""

    @abstractmethod
    def parse(self, reply: str) -> list[ToolCall]:
        """The reply's calls in order; [] for a reply without any (a final answer)."""

    @abstractmethod
    def content(self, reply: str) -> str:
        """The reply's text without its calls."""

    def closed(self, text: str) -> tuple[list[ToolCall], int]:
        """(a format with MARKER) The calls closed in `text` (a reply so far), and where the last ends."""
        raise NotImplementedError(f"tool_call_format {self.name} reads calls only from a whole reply")


class Hermes(ToolCallFormat):
    name = "hermes"
    MARKER = "<tool_call>"
    CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    CLOSE = "</tool_call>"

    def parse(self, reply: str) -> list[ToolCall]:
        calls, _ = self.closed(reply)
        if reply.count("<tool_call>") > len(calls):
            calls.append("malformed tool call: <tool_call> without its closing </tool_call>")
        return calls

    def closed(self, text: str) -> tuple[list[ToolCall], int]:
        """The calls closed in `text` (a reply so far), in order, and where the last one ends."""
        calls: list[ToolCall] = []
        end = 0
        for match in self.CALL.finditer(text):
            try:
                calls.append(_call(json.loads(match.group(1))))
            except json.JSONDecodeError as e:
                calls.append(_not_json(match.group(1), e))
            end = match.end()
        return calls, end

    def content(self, reply: str) -> str:
        return self.CALL.sub("", reply).strip()


class Llama3Json(ToolCallFormat):
    name = "llama3_json"
    TAG = "<|python_tag|>"

    def parse(self, reply: str) -> list[ToolCall]:
        """Calls: JSON objects with a "name", from the start of the reply; text after them is left
        as content, and a reply that is not such an object (a JSON answer among them) has none."""
        text = reply.strip().removeprefix(self.TAG).strip()
        decoder, calls, pos = json.JSONDecoder(), list[ToolCall](), 0
        while text.startswith("{", pos):
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                if not calls and '"name"' in text:  # a call the model did not finish writing
                    calls.append(_not_json(text, e))
                break
            if not (isinstance(value, dict) and "name" in value):
                break
            calls.append(_call(value, "parameters"))
            pos = end
            while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
                pos += 1
        return calls

    def content(self, reply: str) -> str:
        if not self.parse(reply):
            return reply.strip()
        text, decoder, pos = reply.strip().removeprefix(self.TAG).strip(), json.JSONDecoder(), 0
        while text.startswith("{", pos):
            try:
                _, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return ""
            while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
                pos += 1
        return text[pos:].strip()


class Mistral(ToolCallFormat):
    name = "mistral"
    MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def _calls_text(self, reply: str) -> tuple[str, str] | None:
        """(text before the calls, the calls' text), None for a reply without calls."""
        if self.MARK in reply:
            before, _, after = reply.partition(self.MARK)
            return before.strip(), after.strip()
        stripped = reply.strip()
        if stripped.startswith("[{"):  # the marker was a special token that decoding dropped
            return "", stripped
        return None

    def parse(self, reply: str) -> list[ToolCall]:
        found = self._calls_text(reply)
        if found is None:
            return []
        text = found[1]
        if self.ARGS in text:  # v11: name[ARGS]{...}, repeated after each [TOOL_CALLS]
            calls: list[ToolCall] = []
            for part in text.split(self.MARK):
                name, _, body = part.partition(self.ARGS)
                try:
                    calls.append(_call({"name": name.strip(), "arguments": json.loads(body)}))
                except json.JSONDecodeError as e:
                    calls.append(_not_json(body, e))
            return calls
        try:
            value, _ = json.JSONDecoder().raw_decode(text)
        except json.JSONDecodeError as e:
            return [_not_json(text, e)]
        return [_call(v) for v in value] if isinstance(value, list) else [_call(value)]

    def content(self, reply: str) -> str:
        found = self._calls_text(reply)
        return reply.strip() if found is None else found[0]


class ResponseTemplate(ToolCallFormat):
    """The tokenizer's declared parser (transformers' `parse_response`)."""

    name = "response_template"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _message(self, reply: str) -> dict[str, Any]:
        try:
            message = self.tokenizer.parse_response(reply, prefix="")
        except Exception as e:  # the parser refuses what the model wrote: the model reads why
            return {"content": reply, "error": f"malformed tool call: {type(e).__name__}: {e}"}
        return message if isinstance(message, dict) else {"content": reply}

    def parse(self, reply: str) -> list[ToolCall]:
        message = self._message(reply)
        if "error" in message:
            return [message["error"]]
        calls = message.get("tool_calls") or []
        return [_call(c.get("function", c) if isinstance(c, dict) else c) for c in calls]

    def content(self, reply: str) -> str:
        return str(self._message(reply).get("content") or "").strip()


FORMATS: dict[str, type[ToolCallFormat]] = {f.name: f for f in (Hermes, Llama3Json, Mistral)}
CHOICES = ("auto", *FORMATS, ResponseTemplate.name)


def resolve(name: str, tokenizer: Any = None, chat_template: str | None = None) -> ToolCallFormat:
    """The format `name` (one of CHOICES); `auto`: the tokenizer's response template if it declares
    one, else the one its chat template renders tool calls in (Hermes when it shows none)."""
    if name not in CHOICES:
        raise ValueError(f"tool_call_format must be one of {', '.join(CHOICES)}; got '{name}'")
    if name == ResponseTemplate.name or (name == "auto" and getattr(tokenizer, "response_template", None)):
        if not getattr(tokenizer, "response_template", None):
            raise ValueError(
                "tool_call_format response_template: the tokenizer declares no response_template"
            )
        return ResponseTemplate(tokenizer)
    if name != "auto":
        return FORMATS[name]()
    template = chat_template or str(getattr(tokenizer, "chat_template", None) or "")
    if Mistral.MARK in template:
        return Mistral()
    if "<tool_call>" in template:
        return Hermes()
    if Llama3Json.TAG in template or '"parameters"' in template:
        return Llama3Json()
    return Hermes()
