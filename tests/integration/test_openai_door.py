"""The OpenAI-compatible door of `rlcore rollout serve --http-port`, driven by the real `openai`
package from this process: models, completions and chat (tools, logprobs, n, stop, seed), errors
in OpenAI's shape, and an episode recorded over several turns whose experience holds exactly the
tokens and log-probs the engine generated (FinishEpisode over gRPC)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def worker(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(gRPC address, HTTP base URL) of a worker serving the scratch BPE model."""
    log_dir = tmp_path_factory.mktemp("door")
    grpc_file, http_file = log_dir / "grpc", log_dir / "http"
    cmd = [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", bpe_model_path, "--threads", "1",
           "--token-env", TOKEN_ENV, "--port", "0", "--port-file", str(grpc_file), "--http-port", "0",
           "--http-port-file", str(http_file), "--served-model-name", "tiny"]  # fmt: skip
    with open(log_dir / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, stderr=err)
    address = wait_for_port_file(str(grpc_file), proc, "rollout worker", 120, log_file=str(log_dir / "stderr"))
    http = wait_for_port_file(str(http_file), proc, "HTTP door", 30, log_file=str(log_dir / "stderr"))
    yield address, f"http://{http}/v1"
    proc.kill()
    proc.wait()


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
    assert len(one.choices) == 2 and one.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in one.choices)
    for c in one.choices:
        assert len(c.logprobs.token_logprobs) == len(c.model_extra["token_ids"]) <= 6
        assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    again = api.completions.create(model="tiny", prompt="12+7=", max_tokens=6, seed=5, n=2)
    assert [c.model_extra["token_ids"] for c in again.choices] == [c.model_extra["token_ids"] for c in one.choices]
    greedy = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0)
    assert greedy.choices[0].message.role == "assistant" and greedy.model_extra["policy_version"] == 0


@pytest.mark.parametrize(
    "call, error, match",
    [
        (dict(temperature="hot"), openai.BadRequestError, "temperature: must be a number"),
        (dict(temperature=-1), openai.BadRequestError, "temperature: must be >= 0"),
        (dict(max_tokens=300), openai.BadRequestError, r"max_tokens: 300 leaves no room for a prompt within max_model_len 256"),
        (dict(top_logprobs=3, logprobs=True), openai.BadRequestError, "top_logprobs: only 0 is served"),
        (dict(messages=[{"role": "robot", "content": "x"}]), openai.BadRequestError, r"messages\[0\]\.role: must be one of"),
        (dict(n=2, extra_body={"episode_id": "e"}), openai.BadRequestError, "n: a recorded episode is one conversation"),
        (dict(model="gpt-4"), openai.NotFoundError, "model 'gpt-4' is not served here; this worker serves 'tiny'"),
    ],
)  # fmt: skip
def test_bad_requests_answer_in_openais_error_shape(api: openai.OpenAI, call: dict, error: type, match: str) -> None:
    request: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **call}
    with pytest.raises(error, match=match) as e:
        api.chat.completions.create(**request)
    assert e.value.body["type"] in ("invalid_request_error", "not_found_error") and "param" in e.value.body


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
    for turn, follow_up in enumerate([{"role": "tool", "content": "1702"}, {"role": "user", "content": "sure?"}, None]):
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
    first_prompt = tokenizer.apply_chat_template(messages[:1], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert exp.prompt_token_ids == tokenizer(first_prompt, add_special_tokens=False)["input_ids"]
    with pytest.raises(RpcError, match="NOT_FOUND.*no episode 'episode-1' is recorded here"):
        rollout.finish_episode("episode-1", reward=0.0)  # finished: gone


def test_completions_episodes_continue_by_text_prefix(api: openai.OpenAI, rollout: RolloutClient) -> None:
    first = api.completions.create(model="tiny", prompt="12+7=", max_tokens=4, seed=1, extra_body={"episode_id": "text"})
    c1 = first.choices[0]
    follow = "12+7=" + c1.text + " and 3+4="
    second = api.completions.create(model="tiny", prompt=follow, max_tokens=4, seed=2, extra_body={"episode_id": "text"})
    c2 = second.choices[0]
    (exp,) = rollout.finish_episode("text", reward=1.0)
    trained = [t for t, m in zip(exp.response_token_ids, exp.loss_mask, strict=True) if m]
    assert trained == c1.model_extra["token_ids"] + c2.model_extra["token_ids"]
    assert exp.response_token_ids[: len(c1.model_extra["token_ids"])] == c1.model_extra["token_ids"]
    assert exp.loss_mask.count(0) > 0 and second.usage.prompt_tokens == len(exp.prompt_token_ids) + exp.loss_mask.index(1, len(c1.model_extra["token_ids"]))
