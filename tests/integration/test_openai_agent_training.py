"""An agent written against the `openai` package (examples/openai_agent.py) trained by rlcore: its
chat requests to a rollout worker's HTTP door are recorded as episodes, FinishEpisode turns them
into experiences, a `rlcore trainer serve` world takes GRPO steps on them and pushes the weights
back to the worker, whose next answers come from the new version."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from rlcore.client.base import ClientOptions
from rlcore.client.trainer import TrainerClient

from .launch_utils import REPO, tiny_grpo_config, wait_for_port_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOKEN_ENV = "RLCORE_TEST_AGENT_TOKEN"
TOKEN = "agent-test-token"


def test_an_openai_agent_is_trained_on_its_recorded_episodes(bpe_model_path, tmp_path):
    env = {**os.environ, TOKEN_ENV: TOKEN}
    files = {name: str(tmp_path / name) for name in ("grpc", "http", "trainer", "worker.err", "trainer.err")}
    procs = []
    try:
        with open(files["worker.err"], "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", bpe_model_path, "--threads", "1",
                 "--token-env", TOKEN_ENV, "--port", "0", "--port-file", files["grpc"], "--http-port", "0",
                 "--http-port-file", files["http"]], cwd=REPO, env=env, stderr=err))  # fmt: skip
        with open(files["trainer.err"], "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "rlcore.cli", "trainer", "serve", "--device", "cpu", "--threads", "1",
                 "--port", "0", "--port-file", files["trainer"], "--token-env", TOKEN_ENV],
                cwd=REPO, env=env, stderr=err))  # fmt: skip
        worker = wait_for_port_file(files["grpc"], procs[0], "rollout worker", 120, log_file=files["worker.err"])
        http = wait_for_port_file(files["http"], procs[0], "HTTP door", 30, log_file=files["worker.err"])
        trainer = wait_for_port_file(files["trainer"], procs[1], "trainer", 120, log_file=files["trainer.err"])
        cfg = tiny_grpo_config(str(tmp_path), **{"algorithm.repeat_times": 4, "buffer.batch_size": 2,
                                                 "algorithm.optimizer": {"lr": 1e-3}})  # fmt: skip
        cfg["model"] = {"model_path": bpe_model_path, "max_model_len": 256, "max_prompt_tokens": 200,
                        "max_response_tokens": 48, "apply_chat_template": True}  # fmt: skip
        with TrainerClient(trainer, ClientOptions(token=TOKEN, timeout=120)) as c:
            c.configure(yaml.safe_dump(cfg), checkpoint_dir=str(tmp_path / "ckpt"), total_steps=10)
        agent = subprocess.run(
            [sys.executable, "examples/openai_agent.py", "--http", f"http://{http}/v1", "--rollout", worker,
             "--trainer", trainer, "--token-env", TOKEN_ENV, "--steps", "2", "--tasks", "2", "--group", "4",
             "--max-turns", "2", "--partial-credit"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-3000:]
        steps = [json.loads(line) for line in agent.stdout.splitlines()]
        assert [s["step"] for s in steps] == [1, 2] and [s["experiences"] for s in steps] == [8, 8]
        assert [s["policy_version"] for s in steps] == [1, 2]  # each step's weights reached the worker
        # partial credit: rewards differ inside a group, so GRPO has a gradient (sampled: both groups of
        # a step may score alike, so one step of the two is asked for)
        assert any(s["metrics"]["actor/grad_norm"] > 0 for s in steps), [s["metrics"] for s in steps]
        for s in steps:
            assert s["metrics"]["rollout/reward_mean"] == pytest.approx(s["reward_mean"], rel=1e-5)
            # the trainer's log-probs of the recorded tokens equal the engine's: the ids are exact
            assert s["metrics"]["rollout/logprob_diff_max"] < 1e-3, s["metrics"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
