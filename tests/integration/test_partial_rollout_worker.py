"""`rlcore rollout serve --partial-rollout` as a real process: a weight update sent while RunTasks
generates interrupts the engine call instead of waiting for it, and the experiences that come back
name the version of each stretch of their responses (over the wire: common.proto VersionSegment)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from rlcore.client import ClientOptions, RolloutClient
from rlcore.core.config.schema import ScratchModelConfig, SynchronizerConfig
from rlcore.core.scratch_model import build_scratch_model
from rlcore.core.types import Experience, SamplingParams, Task, WorkflowSpec
from rlcore.weights.sender import connect

from .launch_utils import REPO, wait_for_port_file
from .test_rollout_worker import TOKEN, TOKEN_ENV, _serve_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MAX_TOKENS = 200


def test_a_weight_update_interrupts_running_tasks_which_continue_under_the_new_weights(
    tiny_model_path: str, tmp_path
) -> None:
    new_weights = str(tmp_path / "v1")
    build_scratch_model(new_weights, ScratchModelConfig(enabled=True), max_model_len=256, seed=1)
    port_file = tmp_path / "address"
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen(
            _serve_cmd(tiny_model_path, "--partial-rollout", "--port", "0", "--port-file", str(port_file)),
            cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        address = wait_for_port_file(str(port_file), proc, "rollout worker", 120.0, log_file=str(tmp_path / "log"))
        client = RolloutClient(address, ClientOptions(token=TOKEN, timeout=120))
        tasks = [Task(f"task-{i}", f"{i}+{i}=", answer=str(2 * i)) for i in range(3)]
        sampling = SamplingParams(temperature=1.0, n=2, max_tokens=MAX_TOKENS, seed=3, ignore_eos=True)
        answers: list[tuple[int, list[Experience]]] = []
        running = threading.Thread(
            target=lambda: answers.extend(client.run_tasks(tasks, sampling, WorkflowSpec(reward_fn=["exact_match"])))
        )
        running.start()
        deadline = time.monotonic() + 60
        while client.get_info().active_requests == 0:  # the tasks' engine call has begun
            assert running.is_alive() and time.monotonic() < deadline, "the tasks never started generating"
            time.sleep(0.005)
        sender = connect([client], SynchronizerConfig())
        start = time.perf_counter()
        sender.send_checkpoint(new_weights, 1)
        update_s = time.perf_counter() - start
        running.join(timeout=120)
        sender.close()
        assert client.get_info().policy_version == 1
        experiences = [e for _, exps in answers for e in exps]
        assert len(experiences) == 6, log.name
        for e in experiences:
            (v0, before), (v1, after) = e.segments  # one interruption: two stretches
            assert (v0, v1, e.policy_version) == (0, 1, 0), e.segments
            assert before >= 1 and before + after == len(e.response_token_ids) == len(e.logprobs) == MAX_TOKENS
        # the update did not wait for the call: it ended at the next token, not MAX_TOKENS tokens later
        assert max(e.segments[0][1] for e in experiences) < MAX_TOKENS // 2, [e.segments for e in experiences]
        assert update_s < 30, update_s
        client.close()
    finally:
        proc.kill()
        proc.wait()
