"""The OpenAI-compatible door of `rlcore rollout serve --http-port`, driven by the real `openai`
package from this process: models, completions and chat (tools, logprobs, n, stop, seed), errors
in OpenAI's shape, and an episode recorded over several turns whose experience holds exactly the
tokens and log-probs the engine generated (FinishEpisode over gRPC)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from rlcore.client.base import ClientOptions, RpcError
from rlcore.client.rollout import RolloutClient
from rlcore.rollout.tools.calculator import Calculator
from rlcore.rollout.workflows.turns import TurnFormat

from .launch_utils import REPO, wait_for_port_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN_ENV = "RLCORE_TEST_DOOR_TOKEN"
TOKEN = "door-test-token"
TOOLS = [Calculator().schema]


@contextlib.contextmanager
def serving(model: str, log_dir: Path, *flags: str) -> Iterator[tuple[str, str]]:
    """(gRPC address, HTTP base URL) of `rlcore rollout serve` on `model` with its HTTP door, killed
    on exit."""
    grpc_file, http_file = log_dir / "grpc", log_dir / "http"
    cmd = [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", model, "--threads", "1",
           "--token-env", TOKEN_ENV, "--port", "0", "--port-file", str(grpc_file), "--http-port", "0",
           "--http-port-file", str(http_file), "--served-model-name", "tiny", *flags]  # fmt: skip
    with open(log_dir / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, stderr=err)
    try:
        address = wait_for_port_file(str(grpc_file), proc, "rollout worker", 120, log_file=str(log_dir / "stderr"))
        http = wait_for_port_file(str(http_file), proc, "HTTP door", 30, log_file=str(log_dir / "stderr"))
        yield address, f"http://{http}/v1"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def worker(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(gRPC address, HTTP base URL) of a worker serving the scratch BPE model."""
    with serving(bpe_model_path, tmp_path_factory.mktemp("door"), "--http-max-n", "8",
                 "--http-max-request-tokens", "64") as served:  # fmt: skip
        yield served


@pytest.fixture(scope="module")
def api(worker: tuple[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker[1], api_key=TOKEN, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def rollout(worker: tuple[str, str]) -> Iterator[RolloutClient]:
    with RolloutClient(worker[0], ClientOptions(token=TOKEN, timeout=60)) as c:
        yield c


def test_models_completions_and_seeds(api: openai.OpenAI) -> None:
    models = api.models.list()
    assert [m.id for m in models.data] == ["tiny"] and models.data[0].model_extra["max_model_len"] == 256
    one = api.completions.create(model="tiny", prompt="12+7=", max_tokens=6, seed=5, n=2, logprobs=1)
    assert len(one.choices) == 2 and one.usage.completion_tokens == sum(
        len(c.model_extra["token_ids"]) for c in one.choices
    )
    for c in one.choices:
        assert len(c.logprobs.token_logprobs) == len(c.model_extra["token_ids"]) <= 6
        assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    again = api.completions.create(model="tiny", prompt="12+7=", max_tokens=6, seed=5, n=2)
    assert [c.model_extra["token_ids"] for c in again.choices] == [
        c.model_extra["token_ids"] for c in one.choices
    ]
    greedy = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert greedy.choices[0].message.role == "assistant" and greedy.model_extra["policy_version"] == 0


def test_penalties_bias_min_tokens_ignore_eos_and_stop_token_ids_are_served(
    api: openai.OpenAI, bpe_model_path: str
) -> None:
    """OpenAI's logit_bias and penalties, vLLM's min_tokens, ignore_eos and stop_token_ids (through
    the SDK's extra_body), each forced by a bias so that the answer is known."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_model_path)
    x, eos = tokenizer("7", add_special_tokens=False)["input_ids"][0], tokenizer.eos_token_id

    def chat(**kwargs: Any) -> Any:
        return api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kwargs
        ).choices[0]

    forced = chat(logit_bias={str(x): 100}, temperature=0)
    assert forced.model_extra["token_ids"] == [x] * 4 and forced.finish_reason == "length"
    stopped = chat(logit_bias={str(x): 100}, temperature=0, extra_body={"stop_token_ids": [x]})
    assert stopped.model_extra["token_ids"] == [x] and stopped.finish_reason == "stop"
    ended = chat(logit_bias={str(eos): 100}, temperature=0)
    assert ended.model_extra["token_ids"] == [eos]
    ignored = chat(logit_bias={str(eos): 100}, temperature=0, extra_body={"ignore_eos": True})
    assert ignored.model_extra["token_ids"] == [eos] * 4 and ignored.finish_reason == "length"
    held = chat(logit_bias={str(eos): 100, str(x): 50}, temperature=0, extra_body={"min_tokens": 2})
    assert held.model_extra["token_ids"] == [x, x, eos]
    penalised = chat(
        logit_bias={str(x): 3, str(eos): -100}, temperature=0, frequency_penalty=2, presence_penalty=0
    )
    assert (
        penalised.model_extra["token_ids"][:2] == [x, x] and x not in penalised.model_extra["token_ids"][2:]
    )


def test_concurrent_requests_share_engine_calls_and_answer_as_alone(api: openai.OpenAI) -> None:
    """Eight seeded requests at once go through the worker's batching engine together; each answer
    is the one the request gets alone (the merge never mixes up whose completion is whose)."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"{i}+{i}=" for i in range(8)]

    def ask(p: str) -> list[int]:
        answer = api.completions.create(model="tiny", prompt=p, max_tokens=6, seed=3)
        return answer.choices[0].model_extra["token_ids"]

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ask, prompts)) == alone


@pytest.mark.parametrize(
    "call, error, match",
    [
        (dict(temperature="hot"), openai.BadRequestError, "temperature: must be a finite number"),
        (dict(temperature=-1), openai.BadRequestError, "temperature: must be >= 0"),
        (dict(max_tokens=300), openai.BadRequestError, r"max_tokens: 300 leaves no room for a prompt within max_model_len 256"),
        (dict(top_logprobs=3), openai.BadRequestError, "top_logprobs: is taken only with logprobs: true"),
        (dict(messages=[{"role": "robot", "content": "x"}]), openai.BadRequestError, r"messages\[0\]\.role: must be one of"),
        (dict(n=2, extra_body={"episode_id": "e"}), openai.BadRequestError, "n: a recorded episode is one conversation"),
        (dict(model="gpt-4"), openai.NotFoundError, "model 'gpt-4' is not served here; this worker serves 'tiny'"),
    ],
)  # fmt: skip
def test_bad_requests_answer_in_openais_error_shape(
    api: openai.OpenAI, call: dict, error: type, match: str
) -> None:
    request: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **call,
    }
    with pytest.raises(error, match=match) as e:
        api.chat.completions.create(**request)
    assert e.value.body["type"] in ("invalid_request_error", "not_found_error") and "param" in e.value.body


MALFORMED: list[tuple[str, Any, str | None]] = [
    # (endpoint, body: a dict, or raw bytes, param the error names)
    ("chat", b"{not json", "body"),
    ("chat", b"\xff\xfe\x00garbage", "body"),
    ("chat", b"[" * 100_000 + b"]" * 100_000, "body"),
    ("chat", b'"just a string"', "body"),
    ("chat", {"messages": None}, "messages"),
    ("chat", {"messages": []}, "messages"),
    ("chat", {"messages": "hi"}, "messages"),
    ("chat", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("chat", {"max_tokens": 0}, "max_tokens"),
    ("chat", {"max_tokens": -3}, "max_tokens"),
    ("chat", {"max_tokens": 10**30}, "max_tokens"),
    ("chat", {"max_tokens": 4.5}, "max_tokens"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat", {"top_p": 0}, "top_p"),
    ("chat", {"top_p": 1.5}, "top_p"),
    ("chat", {"top_k": 10**20}, "top_k"),
    ("chat", {"min_p": 2}, "min_p"),
    ("chat", {"repetition_penalty": 0}, "repetition_penalty"),
    ("chat", {"temperature": "hot"}, "temperature"),
    ("chat", {"temperature": True}, "temperature"),
    ("chat", {"temperature": -0.5}, "temperature"),
    ("chat", {"seed": 99999999999999999999999}, "seed"),
    ("chat", {"seed": "7"}, "seed"),
    ("chat", {"n": 0}, "n"),
    ("chat", {"n": 100000}, "n"),
    ("chat", {"n": 8, "max_tokens": 20}, "max_tokens"),  # 160 tokens: past --http-max-request-tokens
    ("chat", {"stop": [1, 2]}, "stop[0]"),
    ("chat", {"stop": ["x", "\ud800"]}, "stop[1]"),  # a lone surrogate: a JavaScript string cut in an emoji
    ("chat", {"model": "ti\ud800ny"}, "model"),
    ("chat", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ("completions", {"prompt": "12\ud800"}, "prompt"),
    ("chat", {"episode_id": "e" * 100_000}, "episode_id"),
    ("chat", {"user": 5}, "user"),
    ("chat", {"model": None, "stream": 1}, "stream"),
    ("chat", {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ("chat", {"stream": True, "stream_options": {"continuous": True}}, "stream_options.continuous"),
    ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty"),
    ("chat", {"logit_bias": {"x": 10}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": "high"}}, "logit_bias.5"),
    ("chat", {"logit_bias": {"999999": 1}}, "logit_bias"),
    ("chat", {"logit_bias": [5]}, "logit_bias"),
    ("chat", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    ("chat", {"response_format": {"type": "json_object"}, "ignore_eos": True}, "response_format"),  # the grammar ends the text
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),  # the engine cannot compile it
    ("chat", {"parallel_tool_calls": False}, "parallel_tool_calls"),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "calculator"}}}, "tool_choice"),
    ("chat", {"min_tokens": 5}, "min_tokens"),  # past max_tokens 4
    ("chat", {"min_tokens": -1}, "min_tokens"),
    ("chat", {"ignore_eos": "yes"}, "ignore_eos"),
    ("chat", {"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ("chat", {"stop_token_ids": 3}, "stop_token_ids"),
    ("chat", {"no_such_parameter": 1}, "no_such_parameter"),
    ("chat", {"messages": [{"role": "user", "content": "x" * 4000}]}, "messages"),  # past max_model_len
    ("completions", {"prompt": "x" * 4_000_000}, "prompt"),  # refused before it is tokenized
    ("chat", {"messages": [{"role": "user", "content": "12+" * 1_000_000}]}, "messages[0].content"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": [1, "a"]}, "prompt"),
    ("completions", {"prompt": [10**9]}, "prompt"),
    ("completions", {"prompt": "x", "best_of": 3}, "best_of"),
    ("completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
    ("completions", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("completions", {"prompt": "x", "messages": []}, "messages"),
]

BAD_VALUES: dict[str, list[Any]] = {
    # a parameter both endpoints take -> values each of which is wrong (type, range, or past 32/64 bits)
    "temperature": ["hot", True, -0.5, [], {}, float("nan"), float("inf")],
    "top_p": [0, 1.5, -1, "x", True, float("nan")],
    "top_k": [10**20, -2, 1.5, "5", True],
    "min_p": [2, -0.1, "x", []],
    "repetition_penalty": [0, -1, "x", float("inf")],
    "n": [0, -1, 100000, 1.5, "2", 10**20, True],
    "seed": [10**23, -(10**23), "7", 1.5, True, [1]],
    "max_tokens": [0, -3, 10**30, 4.5, "4", True, [4]],
    "stop": [[1, 2], 5, {"a": 1}, [None], True],
    "presence_penalty": [2.5, -3, "x", float("nan")],
    "frequency_penalty": [2.01, -2.5, [], True],
    "logit_bias": [{"x": 1}, {"5": 101}, {"5": -100.5}, [5], "5", {"999999": 1}, {"-1": 1}],
    "min_tokens": [-1, 5, "1", 1.5, 10**20],
    "ignore_eos": ["yes", 1, [], {}],
    "stop_token_ids": [[-1], 3, ["a"], [10**12], [999999]],
    "user": [5, [], {}, True],
    "episode_id": ["", 5, []],
    "model": [5, [], {}],
}
UNKNOWN_OR_UNSERVED: dict[str, list[tuple[str, Any]]] = {
    "chat": [("no_such_parameter", 1), ("temperaturee", 1.0), ("max_token", 4), ("prompt", "x"),
             ("response_format", {"type": "json_object", "strict": True}), ("parallel_tool_calls", False), ("stream", "yes"),
             ("functions", [{"name": "f"}]), ("function_call", "auto"), ("audio", {"voice": "x"}),
             ("modalities", ["audio"]), ("store", True), ("stream_options", {"include_usage": True}),
             ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "high"),
             ("service_tier", "flex"), ("web_search_options", {}), ("metadata", {"a": "b"}),
             ("tool_choice", "required"), ("top_logprobs", 21), ("top_logprobs", -1), ("logprobs", "yes"),
             ("max_completion_tokens", 0), ("max_completion_tokens", "4"), ("tools", "calculator")],
    "completions": [("no_such_parameter", 1), ("messages", []), ("echo", "yes"), ("best_of", 3), ("suffix", "y"),
                    ("logprobs", 6), ("logprobs", -1), ("logprobs", "1"), ("stream", 1),
                    ("stream_options", {"include_usage": True}), ("tools", []), ("max_completion_tokens", 4)],
}  # fmt: skip
BAD_BODIES = [b"{not json", b"", b"null", b"[]", b"1", b'"just a string"', b"\xff\xfe\x00garbage",
              b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 5000 + b"1" + b"}" * 5000, b'{"max_tokens": 4',
              b'{"max_tokens": 4}}', b"\xef\xbb\xbf{}x"]  # fmt: skip
BAD_MESSAGES = [None, [], "hi", [None], ["hi"], [{}], [{"role": "user"}], [{"role": "user", "content": None}],
                [{"role": "user", "content": 5}], [{"role": "robot", "content": "x"}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                [{"role": "assistant", "content": None}],
                [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
                [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}]]  # fmt: skip
BAD_PROMPTS = [None, "", [], [1, "a"], [10**9], [-1], 5, {"text": "x"}, [[]], [["a", "b"]], True]


def generated_malformed() -> list[tuple[str, Any, str | None]]:
    """Hundreds of wrong requests of varied kinds, both endpoints (param None: the test reads it
    from the case: the body's key, or `body` for raw bytes, `messages`/`prompt` for those)."""
    cases: list[tuple[str, Any, str | None]] = []
    for endpoint in ("chat", "completions"):
        cases += [(endpoint, {key: value}, None) for key, values in BAD_VALUES.items() for value in values]
        cases += [(endpoint, {key: value}, None) for key, value in UNKNOWN_OR_UNSERVED[endpoint]]
        cases += [(endpoint, body, "body") for body in BAD_BODIES]
    cases += [("chat", {"messages": m}, None) for m in BAD_MESSAGES]
    cases += [("completions", {"prompt": p}, None) for p in BAD_PROMPTS]
    return cases


def test_malformed_requests_are_each_a_4xx_naming_the_parameter(
    worker: tuple[str, str], api: openai.OpenAI
) -> None:
    """Bad JSON, wrong types, out-of-range numbers (past 32 and 64 bits too), unknown parameters,
    OpenAI's parameters this door does not serve, a prompt past the model length, invalid UTF-8,
    JSON nested past the parser, wrong routes and methods: each a 4xx in OpenAI's shape naming what
    is wrong, and the door serves a valid request after each."""
    import httpx

    base, headers = worker[1], {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    chat_defaults = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(timeout=60) as http:
        cases = MALFORMED + generated_malformed()
        assert len(cases) >= 300
        for endpoint, body, param in cases:
            exact = param is not None  # else the case's own key names it, or begins the name
            if param is None:
                (param,) = body
            path = "/chat/completions" if endpoint == "chat" else "/completions"
            if isinstance(body, bytes):
                content = body
            else:
                full = {
                    **(
                        chat_defaults
                        if endpoint == "chat"
                        else {"model": "tiny", "prompt": "1+1=", "max_tokens": 4}
                    ),
                    **body,
                }
                content = json.dumps(full).encode()
            answer = http.post(base + path, content=content, headers=headers)
            assert 400 <= answer.status_code < 500, (
                endpoint,
                body if not isinstance(body, bytes) else body[:20],
                answer.text,
            )
            error = answer.json()["error"]
            named = error["param"] if exact else error["param"].split(".")[0].split("[")[0]
            assert named == param, (endpoint, body, error)
            assert error["message"].startswith(f"{error['param']}: "), (body, error)
            assert error["type"] == "invalid_request_error"
            assert api.completions.create(model="tiny", prompt="1+1=", max_tokens=2).choices  # still serving
        for method, path, status in (
            ("GET", "/nowhere", 404),
            ("GET", "/chat/completions", 405),
            ("DELETE", "/models", 405),
        ):
            answer = http.request(method, base + path, headers=headers)
            assert (
                answer.status_code == status and answer.json()["error"]["type"] == "invalid_request_error"
            ), answer.text
        health = http.get(base.removesuffix("/v1") + "/health", headers=headers)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert http.get(base.removesuffix("/v1") + "/health").status_code == 401  # the token, as every door
    assert api.models.retrieve("tiny").model_extra["max_model_len"] == 256
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' is not served here"):
        api.models.retrieve("gpt-4")
    reply = api.completions.create(model="tiny", prompt="1+1=", max_tokens=2)
    assert reply.model_extra["prompt_token_ids"] and all(
        isinstance(t, int) for t in reply.model_extra["prompt_token_ids"]
    )


def test_a_wrong_key_is_refused(worker: tuple[str, str]) -> None:
    bad = openai.OpenAI(base_url=worker[1], api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
        bad.models.list()


def test_a_recorded_episode_is_the_engines_tokens_turn_by_turn(
    api: openai.OpenAI, rollout: RolloutClient, bpe_model_path: str
) -> None:
    """Three chat turns in one episode (the agent sends back the replies it got, plus new turns):
    one experience whose trained tokens are the three replies' token ids with their log-probs, and
    whose context tokens are what the template renders for the agent's new turns."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_model_path)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 37*46?"}]
    replies, inserted = [], []
    for turn, follow_up in enumerate(
        [{"role": "tool", "content": "1702"}, {"role": "user", "content": "sure?"}, None]
    ):
        answer = api.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, max_tokens=8, seed=turn, logprobs=True,
            extra_body={"episode_id": "episode-1"},
        )  # fmt: skip
        choice = answer.choices[0]
        ids = choice.model_extra["token_ids"]
        replies.append((ids, [t.logprob for t in choice.logprobs.content]))
        messages.append(choice.message.model_dump(exclude_none=True))
        if follow_up is not None:
            inserted.append(TurnFormat(tokenizer, True, None, None, TOOLS).after_reply(ids, [follow_up]))
            messages.append(follow_up)
    (exp,) = rollout.finish_episode("episode-1", reward=0.5, group_id="task-7")
    assert exp.reward == 0.5 and exp.group_id == "task-7" and exp.metrics["turns"] == 3
    expected_ids = replies[0][0] + inserted[0] + replies[1][0] + inserted[1] + replies[2][0]
    expected_mask = [1] * len(replies[0][0]) + [0] * len(inserted[0]) + [1] * len(replies[1][0])
    expected_mask += [0] * len(inserted[1]) + [1] * len(replies[2][0])
    assert exp.response_token_ids == expected_ids and exp.loss_mask == expected_mask
    trained = [lp for lp, m in zip(exp.logprobs, exp.loss_mask, strict=True) if m]
    assert trained == pytest.approx([lp for _, lps in replies for lp in lps], abs=1e-6)
    first_prompt = tokenizer.apply_chat_template(
        messages[:1], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert exp.prompt_token_ids == tokenizer(first_prompt, add_special_tokens=False)["input_ids"]
    with pytest.raises(RpcError, match="NOT_FOUND.*no episode 'episode-1' is recorded here"):
        rollout.finish_episode("episode-1", reward=0.0)  # finished: gone


def test_completions_episodes_continue_by_text_prefix(api: openai.OpenAI, rollout: RolloutClient) -> None:
    first = api.completions.create(
        model="tiny", prompt="12+7=", max_tokens=4, seed=1, extra_body={"episode_id": "text"}
    )
    c1 = first.choices[0]
    follow = "12+7=" + c1.text + " and 3+4="
    second = api.completions.create(
        model="tiny", prompt=follow, max_tokens=4, seed=2, extra_body={"episode_id": "text"}
    )
    c2 = second.choices[0]
    (exp,) = rollout.finish_episode("text", reward=1.0)
    trained = [t for t, m in zip(exp.response_token_ids, exp.loss_mask, strict=True) if m]
    assert trained == c1.model_extra["token_ids"] + c2.model_extra["token_ids"]
    assert exp.response_token_ids[: len(c1.model_extra["token_ids"])] == c1.model_extra["token_ids"]
    assert exp.loss_mask.count(0) > 0 and second.usage.prompt_tokens == len(
        exp.prompt_token_ids
    ) + exp.loss_mask.index(1, len(c1.model_extra["token_ids"]))
