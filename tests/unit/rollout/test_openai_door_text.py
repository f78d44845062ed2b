"""The OpenAI-compatible door (rollout/openai_door.py) over loopback against text it cannot take: every
field of its request models (generated from the pydantic models, so a new field is fuzzed too), and
every string and key of a full chat request, given a lone UTF-16 surrogate, a string longer than
any cap, or bytes that are not UTF-8: each a 4xx in OpenAI's shape naming the field, never a 5xx,
never a library's words. Then the ids in headers, the model in the path, and the Authorization
scheme. Sent with httpx: the openai SDK cannot encode a lone surrogate."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.http_door import HttpDoor
from rlcore.rollout.openai_app import build_app
from rlcore.rollout.openai_door import OpenAIDoor
from rlcore.rollout.openai_schema import MAX_ID_CHARS, ChatBody, CompletionBody
from rlcore.rollout.server import RolloutServicer
from rlcore.rollout.tools.calculator import Calculator

TOKEN = "door-text-token"
NOT_UTF8 = "@@not-utf-8@@"
"""Stands for bytes that are not UTF-8; replaced in the encoded body (JSON cannot hold them)."""
BASES = {
    "completions": {"model": "tiny", "prompt": "1+1=", "max_tokens": 2},
    "chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
MODELS = {"completions": CompletionBody, "chat/completions": ChatBody}
FULL_CHAT = {
    "model": "tiny", "max_tokens": 2, "stop": ["</s>", "\n\n"], "user": "agent-7", "episode_id": "text-episode",
    "logit_bias": {"5": 1.0}, "tools": [Calculator().schema], "tool_choice": "auto",
    "messages": [
        {"role": "system", "content": "You add."}, {"role": "user", "content": [{"type": "text", "text": "1+1?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
    ],
}  # fmt: skip
"""A chat request with a string in every place OpenAI's SDKs put one: each is fuzzed in turn."""


@pytest.fixture(scope="module")
def door(bpe_model_path: str) -> Iterator[tuple[str, OpenAIDoor]]:
    """(base URL, the door) of a door over the scratch BPE model, in this process."""
    engine = HFEngine(bpe_model_path)
    servicer = RolloutServicer(engine, engine_name="hf", model_path=bpe_model_path)
    logic = OpenAIDoor(servicer, servicer.episodes, TOKEN, "tiny")
    http = HttpDoor(build_app(logic), "127.0.0.1", 0, "tiny")
    yield f"http://{http.address}/v1", logic
    http.stop()


@pytest.fixture(scope="module")
def client(door: tuple[str, OpenAIDoor]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=door[0], headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c:
        yield c


def bad_strings(door: OpenAIDoor) -> dict[str, str]:
    return {
        "surrogate": "\ud800",
        "overlong": "x" * (max(door.max_chars, MAX_ID_CHARS) + 1),
        "not-utf-8": NOT_UTF8,
    }


# ---------------------------------------------------------------------------------------------
# cases generated from the models' JSON schema


def resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return defs[node["$ref"].split("/")[-1]] if "$ref" in node else node


def example(node: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A value the schema `node` takes (a union's first branch; bounds respected; required keys only)."""
    node = resolve(node, defs)
    branches = node.get("anyOf") or node.get("oneOf")
    if branches:
        return example(next(b for b in branches if b.get("type") != "null"), defs)
    if "enum" in node or "const" in node:
        return node.get("const", (node.get("enum") or [None])[0])
    kind = node.get("type")
    if kind in ("integer", "number"):
        value = max(1, node.get("minimum", 1), node.get("exclusiveMinimum", 0) + 1)
        return min(value, node.get("maximum", value))
    simple = {"string": "x", "boolean": False, "null": None}
    if kind in simple:
        return simple[kind]
    if kind == "array":
        return [example(node["items"], defs)]
    return {k: example(node["properties"][k], defs) for k in node.get("required", [])}


def flat(node: dict[str, Any], defs: dict[str, Any], seen: frozenset[str]) -> list[dict[str, Any]]:
    """The shapes `node` takes: its union's branches, unions in them flattened (a recursive type
    met again: any value)."""
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        node = {} if name in seen else defs[name]
    branches = node.get("anyOf") or node.get("oneOf")
    return [shape for b in branches for shape in flat(b, defs, seen)] if branches else [node]


def placements(
    node: dict[str, Any], defs: dict[str, Any], path: str, bad: str, seen: frozenset[str] = frozenset()
) -> Iterator[tuple[str, Any, str]]:
    """(path, value, how the error must name it) for `bad` put in each place of a value of `node`:
    the value itself, each property, the first item, a key and a value of an object of free keys.
    how: "exact" (a place that takes strings: the error names it), "key" (names it, or a key of it),
    "within" (a place that takes no string: the error names it or a field around it)."""
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        if name in seen:  # a recursive type (JSON): one level is enough
            yield path, bad, "exact"
            return
        node, seen = defs[name], seen | {name}
    branches = flat(node, defs, seen)
    takes_text = any(b.get("type") in ("string", None) for b in branches)
    yield path, bad, "exact" if takes_text else "within"
    for branch in branches:
        if branch.get("type") == "array":
            for p, v, how in placements(branch["items"], defs, f"{path}[0]", bad, seen):
                yield p, [v], how
        if branch.get("type") == "object":
            required = {k: example(branch["properties"][k], defs) for k in branch.get("required", [])}
            for name, sub in branch.get("properties", {}).items():
                for p, v, how in placements(sub, defs, f"{path}.{name}", bad, seen):
                    yield p, {**required, name: v}, how
            free = branch.get("additionalProperties")
            if isinstance(free, dict):
                yield path, {**required, bad: example(free, defs)}, "key"
                for p, v, how in placements(free, defs, f"{path}.k", bad, seen):
                    yield p, {**required, "k": v}, how


def model_cases(route: str, bad: str) -> list[tuple[str, dict[str, Any], str]]:
    """(path, body, how) for each place of each field of the route's request model."""
    schema = MODELS[route].model_json_schema()
    defs = schema.get("$defs", {})
    cases: dict[tuple[str, str], tuple[str, dict[str, Any], str]] = {}
    for name, field in schema["properties"].items():
        for path, value, how in placements(field, defs, name, bad):
            body = {**BASES[route], name: value}
            key = (path, json.dumps(body))
            if key not in cases or how == "exact":  # a place several branches share: the strictest
                cases[key] = (path, body, how)
    return list(cases.values())


def spots(value: Any, path: str, bad: str) -> Iterator[tuple[str, Any, str]]:
    """(path, value with `bad` in place of one of its strings or keys, how the error names it)."""
    if isinstance(value, str):
        yield path, bad, "exact"
    elif isinstance(value, list):
        for i, item in enumerate(value):
            for p, v, how in spots(item, f"{path}[{i}]", bad):
                yield p, value[:i] + [v] + value[i + 1 :], how
    elif isinstance(value, dict):
        for k, item in value.items():
            yield path, {(bad if key == k else key): v for key, v in value.items()}, "key"
            for p, v, how in spots(item, f"{path}.{k}" if path else k, bad):
                yield p, {**value, k: v}, how


def send(client: httpx.Client, route: str, body: dict[str, Any]) -> httpx.Response:
    """`body` as a JavaScript agent sends it: a lone surrogate as its JSON escape (\\ud800)."""
    content = json.dumps(body).encode().replace(NOT_UTF8.encode(), b"a\xffb\xed\xa0\x80")
    return client.post(f"/{route}", content=content, headers={"Content-Type": "application/json"})


LIBRARY_WORDS = re.compile(
    r"[a-z]Error\b|Exception|Traceback|pydantic|Input should|TextEncodeInput|codec|not allowed"
)


def assert_names(answer: httpx.Response, path: str, how: str, case: Any) -> None:
    """A 4xx in OpenAI's shape whose param names `path` (as `how` says), in the door's own words."""
    assert 400 <= answer.status_code < 500, (case, answer.status_code, answer.text[:300])
    error = answer.json()["error"]
    param, message = error["param"], error["message"]
    assert error["type"] == "invalid_request_error" and message.startswith(f"{param}: "), (case, error)
    named = {
        "exact": param == path,
        "key": param.startswith(path) and param != "body",
        "within": param == path or path.startswith((param + ".", param + "[")),
    }
    assert named[how], (case, how, error)
    assert not LIBRARY_WORDS.search(message), (case, message)


# ---------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_every_field_of_the_request_models_refuses_text_it_cannot_take(
    door: tuple[str, OpenAIDoor], client: httpx.Client, route: str
) -> None:
    fields = set(MODELS[route].model_fields)
    count = 0
    for kind, bad in bad_strings(door[1]).items():
        cases = model_cases(route, bad)
        assert {path.split(".")[0].split("[")[0] for path, _, _ in cases} == fields  # every field
        for path, body, how in cases:
            assert_names(send(client, route, body), path, how, (kind, path))
            count += 1
    assert count >= 3 * len(fields)
    assert client.post(f"/{route}", json=BASES[route]).status_code == 200  # still serving


def test_every_string_and_key_of_a_full_chat_request_refuses_text_it_cannot_take(
    door: tuple[str, OpenAIDoor], client: httpx.Client
) -> None:
    """Message contents and parts, tool call names, ids and arguments, tool schemas, stop strings,
    ids: the places a JavaScript agent cuts a string inside an emoji."""
    assert client.post("/chat/completions", json=FULL_CHAT).status_code == 200
    for kind, bad in bad_strings(door[1]).items():
        for path, body, how in spots(FULL_CHAT, "", bad):
            assert_names(send(client, "chat/completions", body), path, how, (kind, path))
    emoji = {**BASES["completions"], "prompt": "\ud83d\ude00", "stop": ["\ud83d\ude00"]}  # a pair: valid
    assert client.post("/completions", content=json.dumps(emoji).encode()).status_code == 200


def test_ids_in_headers_are_checked_as_the_bodys_and_read_as_utf8(
    door: tuple[str, OpenAIDoor], client: httpx.Client
) -> None:
    for header in ("x" * (MAX_ID_CHARS + 1), b"\xff\xfe", b"ab\xed\xa0\x80", ""):
        answer = client.post("/completions", json=BASES["completions"], headers={"X-Episode-Id": header})
        assert_names(answer, "X-Episode-Id", "exact", header)
    long = client.post("/completions", json={**BASES["completions"], "episode_id": "e" * 100_000})
    assert f"at most {MAX_ID_CHARS} characters" in long.json()["error"]["message"]
    utf8 = {"X-Episode-Id": "épisode".encode()}
    assert client.post("/completions", json=BASES["completions"], headers=utf8).status_code == 200
    assert door[1].recorder.finish("épisode", 1.0, "") is not None  # the same id the body would give


def test_a_model_name_in_the_path_is_echoed_escaped(client: httpx.Client) -> None:
    for name in ("%ED%A0%80", "%FF%FE", "m" * 8000, "gpt-4"):
        answer = client.get(f"/models/{name}")
        assert answer.status_code == 404 and answer.headers["content-type"] == "application/json", answer.text
        error = answer.json()["error"]
        assert error["param"] == "model" and error["type"] == "not_found_error", error
        assert len(error["message"]) < 200


def test_the_token_goes_as_a_bearer_token(door: tuple[str, OpenAIDoor], client: httpx.Client) -> None:
    base = door[0]
    for authorization in (TOKEN, f"Basic {TOKEN}", "Bearer nope", "Bearer", b"Bearer \xff", f"Bearer{TOKEN}"):
        answer = httpx.get(f"{base}/models", headers={"Authorization": authorization})
        assert answer.status_code == 401, authorization
        error = answer.json()["error"]
        assert error["type"] == "authentication_error" and "Authorization: Bearer <token>" in error["message"]
    assert httpx.get(f"{base}/models", headers={"Authorization": f"bearer  {TOKEN}"}).status_code == 200
    sdk = openai.OpenAI(base_url=base, api_key=TOKEN, max_retries=0)
    assert sdk.completions.create(model="tiny", prompt="1+1=", max_tokens=2).choices


def test_bodies_the_json_layer_cannot_read_are_a_400_in_the_doors_words(client: httpx.Client) -> None:
    bodies = [b"\xff{}", b'{"model": "tiny", "\xff": 1}', b"[" * 5000 + b"]" * 5000, b"{", b"\xef\xbb\xbf{}"]
    for raw in bodies:
        answer = client.post("/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert 400 <= answer.status_code < 500, (raw[:20], answer.text)
        assert not LIBRARY_WORDS.search(answer.json()["error"]["message"]), answer.text


@pytest.mark.parametrize(
    "template, says",
    [
        ("{{ raise_exception('roles must alternate') }}", "the model's chat template refuses them: roles must alternate"),
        ("{{ messages[0].nope.deeper }}", "the model's chat template cannot render them"),
        (None, "the model has no chat template"),
    ],
)  # fmt: skip
def test_a_chat_template_that_fails_is_said_in_the_doors_words(
    door: tuple[str, OpenAIDoor], client: httpx.Client, template: str | None, says: str
) -> None:
    tokenizer = door[1].tokenizer
    kept, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        answer = client.post("/chat/completions", json=BASES["chat/completions"])
    finally:
        tokenizer.chat_template = kept
    assert_names(answer, "messages", "exact", template)
    assert answer.json()["error"]["message"].startswith(f"messages: {says}")
