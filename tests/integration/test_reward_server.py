"""`rlcore reward-model serve` on loopback: its scores are the in-process reward model's (alone and
with concurrent callers batched into shared passes), calls without its token or with bad rows are
refused naming the problem, a server that is not there is named after the retries, and a launch
whose taskset names its address scores every rollout with it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch

from rlcore.client.base import ClientOptions, RpcError
from rlcore.client.reward import RewardClient
from rlcore.core.data.prompts import PromptFormat
from rlcore.rollout.rewards.reward_model import RewardModelScorer
from tests.unit.rpc.test_tls import pki  # noqa: F401 - the fixture: a CA, server and client certificates

from .launch_utils import REPO, launch, tiny_grpo_config, wait_for_port_file

pytestmark = pytest.mark.integration

TOKEN_ENV = "RLCORE_TEST_REWARD_TOKEN"
TOKEN = "reward-server-test"

PROMPTS = ["1+1=", "12+30=", "7+8=", "99+1=", "3+4=", "5+5="]
COMPLETIONS = ["<answer>2</answer>", "<answer>42</answer>", "15", "<answer>100</answer>", "seven", "<answer>10"]


def _classifier(base: str, folder: str) -> str:
    """`base`'s trunk as a one-label sequence classifier with a random head, saved in `folder`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def classifier(bpe_model_path, tmp_path_factory) -> str:
    return _classifier(bpe_model_path, str(tmp_path_factory.mktemp("rm")))


@pytest.fixture(scope="module")
def server(classifier, tmp_path_factory):
    port_file = str(tmp_path_factory.mktemp("reward") / "port")
    cmd = [sys.executable, "-m", "rlcore.cli", "reward-model", "serve", "--model", classifier, "--batch-size", "4",
           "--batch-wait-ms", "50", "--port", "0", "--port-file", port_file, "--token-env", TOKEN_ENV]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **{TOKEN_ENV: TOKEN}))
    address = wait_for_port_file(port_file, proc, "reward-model serve")
    yield proc, address
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def _settings(**kw) -> dict:
    return {"path": None, "address": None, "token_env": TOKEN_ENV, "timeout_s": 60.0, "normalize": "none",
            "batch_size": 32, **kw}  # fmt: skip


FORMATS = {
    "plain, truncated": PromptFormat(4),
    "chat template, system prompt": PromptFormat(
        64, apply_chat_template=True, system_prompt="Answer in <answer> tags."
    ),
}


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_served_scores_are_the_in_process_ones(server, classifier, monkeypatch, fmt):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    local = RewardModelScorer(_settings(path=classifier), fmt)
    want = local.scores(PROMPTS, COMPLETIONS)
    assert len(set(round(v, 4) for v in want)) == len(want)  # the head tells them apart
    served = RewardModelScorer(_settings(address=server[1], batch_size=5), fmt)  # two calls: 5 + 1 rows
    assert served.scores(PROMPTS, COMPLETIONS) == pytest.approx(want, abs=1e-5)
    sigmoid = RewardModelScorer(_settings(address=server[1], normalize="sigmoid"), fmt)
    assert sigmoid(PROMPTS, COMPLETIONS, ["t"] * 6) == pytest.approx([1 / (1 + math.exp(-v)) for v in want], abs=1e-5)


def test_concurrent_calls_share_passes_and_each_gets_its_own_scores(server, classifier):
    fmt = FORMATS["plain, truncated"]
    want = RewardModelScorer(_settings(path=classifier), fmt).scores(PROMPTS, COMPLETIONS)
    results: dict[int, list[float]] = {}
    with RewardClient(server[1], ClientOptions(token=TOKEN, timeout=60)) as client:
        before = client.info().rows_scored
        barrier = threading.Barrier(6)

        def call(i: int) -> None:  # caller i sends rows i.. (sizes 6 down to 1)
            barrier.wait()
            results[i] = client.score(PROMPTS[i:], COMPLETIONS[i:], fmt)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        info = client.info()
    for i in range(6):
        assert results[i] == pytest.approx(want[i:], abs=1e-5), i
    assert info.rows_scored - before == 21 and info.batch_size == 4 and info.device == "cpu"
    assert info.model_path == classifier


def test_calls_without_the_token_or_with_bad_rows_are_refused_naming_why(server, monkeypatch):
    fmt = FORMATS["plain, truncated"]
    with RewardClient(server[1], ClientOptions(token="wrong", timeout=30)) as client:
        with pytest.raises(RpcError, match=r"^reward model server .*: Score: UNAUTHENTICATED"):
            client.score(["1+1="], ["2"], fmt)
    with RewardClient(server[1], ClientOptions(token=TOKEN, timeout=30)) as client:
        with pytest.raises(RpcError, match=r"INVALID_ARGUMENT: completions: 1 completions for 2 prompts"):
            client.score(["1+1=", "2+2="], ["2"], fmt)
        bad = client.stub.Score  # a template argument that is not a JSON object, sent as another client might
        from rlcore.proto.v1 import reward_pb2

        request = reward_pb2.ScoreRequest(
            prompts=["1+1="], completions=["2"], prompt_format=reward_pb2.PromptFormat(template_kwargs_json="[1]")
        )
        import grpc

        with pytest.raises(grpc.RpcError) as e:
            bad(request, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
        assert e.value.details() == "prompt_format.template_kwargs_json: must be a JSON object"
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"^reward_model\.token_env: {TOKEN_ENV} is not set here: export it"):
        RewardModelScorer(_settings(address=server[1]), fmt)


def test_a_server_under_mutual_tls_scores_for_a_scorer_with_its_certificates(
    classifier, pki, monkeypatch, tmp_path  # noqa: F811 - pki is the fixture imported above
):
    """reward_model.tls: a scorer with the CA and a client certificate gets the in-process scores from a
    server that requires client certificates; one without its certificate is refused."""
    files = {name: os.path.join(pki, f) for name, f in (("ca_file", "ca.pem"), ("cert_file", "client.pem"),
                                                         ("key_file", "client.key"))}  # fmt: skip
    port_file = str(tmp_path / "port")
    cmd = [sys.executable, "-m", "rlcore.cli", "reward-model", "serve", "--model", classifier, "--port", "0",
           "--port-file", port_file, "--token-env", TOKEN_ENV, "--tls-cert", os.path.join(pki, "server.pem"),
           "--tls-key", os.path.join(pki, "server.key"), "--tls-ca", files["ca_file"], "--tls-require-client-cert"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **{TOKEN_ENV: TOKEN}))
    try:
        address = "localhost:" + wait_for_port_file(port_file, proc, "reward-model serve").rsplit(":", 1)[1]
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        fmt = PromptFormat(16)
        want = RewardModelScorer(_settings(path=classifier), fmt).scores(PROMPTS, COMPLETIONS)
        got = RewardModelScorer(_settings(address=address, tls=files), fmt).scores(PROMPTS, COMPLETIONS)
        assert got == pytest.approx(want, abs=1e-5)
        anonymous = {"ca_file": files["ca_file"], "cert_file": None, "key_file": None, "server_name": None}
        with pytest.raises(RpcError):
            RewardModelScorer(_settings(address=address, tls=anonymous, timeout_s=5.0), fmt).scores(PROMPTS, COMPLETIONS)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_server_that_is_not_there_is_named_after_the_retries(monkeypatch):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    scorer = RewardModelScorer(_settings(address=f"127.0.0.1:{port}", timeout_s=3.0), FORMATS["plain, truncated"])
    with pytest.raises(RpcError, match=rf"^reward model server 127\.0\.0\.1:{port}: Score: UNAVAILABLE"):
        scorer.scores(["1+1="], ["2"])


def test_a_launch_scores_its_rollouts_on_the_server(tmp_path, server, classifier, monkeypatch):
    """reward_model.address in a taskset: the rollout worker calls the server for every response,
    and each logged reward is the in-process model's score of that prompt and response."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # the launch's processes inherit it
    root = str(tmp_path / "served")
    taskset = {"generator": "arithmetic", "path": os.path.join(root, "tasks.jsonl"),
               "generator_args": {"num_tasks": 16, "max_operand": 9}, "reward_fn": ["reward_model"],
               "reward_model": {"address": server[1], "token_env": TOKEN_ENV}}  # fmt: skip
    logged = {"monitor_type": ["jsonl"], "log_completions": True, "save_completions_probability": 1.0}
    cfg = tiny_grpo_config(root, monitor=logged, **{"algorithm.repeat_times": 2, "buffer.total_steps": 1,
                                                    "buffer.explorer_input.taskset": taskset})  # fmt: skip
    with RewardClient(server[1], ClientOptions(token=TOKEN, timeout=60)) as client:
        before = client.info().rows_scored
        launch(cfg, root + ".yaml")
        scored = client.info().rows_scored - before
    run = os.path.join(root, "it", "run")
    with open(os.path.join(run, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert scored == len(rows) == 8  # 4 tasks x 2 responses, each scored once, on the server
    from transformers import AutoTokenizer

    policy = AutoTokenizer.from_pretrained(os.path.join(root, "model"))
    local = RewardModelScorer(_settings(path=classifier), PromptFormat(16))
    responses = []
    for row in rows:  # logged with the policy's special tokens, which the reward's text has not
        responses.append(row["response"])
        for special in policy.all_special_tokens:
            responses[-1] = responses[-1].replace(special, "")
    want = local.scores([r["prompt"] for r in rows], responses)
    assert [r["rewards"]["reward_model"] for r in rows] == pytest.approx(want, abs=1e-5)
