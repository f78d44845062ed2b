"""An asynchronous `both` run (its explorer in a thread, the experiences in an in-memory buffer)
stopped by SIGTERM mid-run and resumed with continue_from_checkpoint: the checkpoint kept the
buffer's untaken groups and the explorer's position, so every task's group is trained exactly once
and the set trained is the one an uninterrupted run trains (the stage's completions log, counted).
Once as configs/asynchronous.yaml runs, once with over-rollout and partial rollouts as
configs/partial_rollout.yaml does (tasks still running at the stop are sent again). The resumed run's
only rollout worker is then killed (-9): the explorer waits for the launch to restart it and
explores on, and still every group is trained once."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.integration.launch_utils import REPO, read_metrics, tiny_grpo_config
from tests.integration.test_worker_failover import _read, _until, _worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS, BATCH, GROUP = 10, 4, 4
PARTIAL = {
    "buffer.explorer_input.taskset.default_workflow_type": "rlcore.benchmarks.partial_rollouts:LongGenerationWorkflow",
    "buffer.explorer_input.taskset.workflow_args": {"long_fraction": 1.0, "turns": 2, "tool_s": 0.0,
                                                   "ignore_eos": False},
    "explorer.over_rollout": {"ratio": 0.25, "wait_after_min": 0.0},
    "explorer.partial_rollout": True,
}  # fmt: skip


@pytest.mark.parametrize("kind", ["asynchronous", "partial_rollout"])
def test_a_stopped_asynchronous_run_resumes_and_trains_every_group_once(tmp_path, kind: str) -> None:
    root = str(tmp_path)
    cfg = tiny_grpo_config(root, **{
        "buffer.total_steps": STEPS, "buffer.batch_size": BATCH, "synchronizer.asynchronous": True,
        "synchronizer.max_staleness": 2, "monitor.log_completions": True,
        "monitor.save_completions_probability": 1.0, **(PARTIAL if kind == "partial_rollout" else {}),
    })  # fmt: skip
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    run_dir = os.path.join(root, "it", "run")
    first = _start(path)
    deadline = time.monotonic() + 300
    while len(_trained_steps(run_dir)) < 2:
        assert first.poll() is None and time.monotonic() < deadline, "".join(first.communicate())[-4000:]
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    out = "".join(first.communicate(timeout=180))
    assert first.returncode == 143 and "stopped at step" in out, out[-4000:]
    stopped_at = len(_trained_steps(run_dir))
    assert 2 <= stopped_at < STEPS, out[-4000:]
    with open(os.path.join(run_dir, "source_state", f"step_{stopped_at}.json")) as f:
        resumes_at = json.load(f)["explorer"]["explore_step"]

    since = time.time()
    resumed = _start(path, "continue_from_checkpoint=true")
    (lines, errors), readers = _read(resumed)
    # the worker dies once the resumed explorer put a step, with steps left to explore (the
    # staleness bound keeps it within max_staleness + 1 steps of the trainer)
    _until(lambda: _explored(run_dir, since) > resumes_at, "an explore step after the resume", resumed)
    assert _explored(run_dir, since) < STEPS - 1, (_explored(run_dir, since), resumes_at)
    _worker(root, 0).kill()
    resumed.wait(timeout=400)
    for r in readers:
        r.join(timeout=10)
    out = "".join(lines + errors)
    assert resumed.returncode == 0, out[-4000:]
    assert "no rollout worker answers: waiting up to" in out, out[-4000:]
    assert f"the in-memory buffer resumed at step {stopped_at}" in out, out[-4000:]

    assert _trained_steps(run_dir) == list(range(1, STEPS + 1))  # each step's row once
    with open(os.path.join(run_dir, "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    counts = collections.Counter(row["group"] for row in rows)
    assert set(counts.values()) == {GROUP}, counts  # every group trained once, whole
    assert set(counts) == _tasks_of_an_uninterrupted_run(path), sorted(counts)


def _start(path: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path, *overrides],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _trained_steps(run_dir: str) -> list[int]:
    try:
        return [m["step"] for m in read_metrics(run_dir) if "buffer/experiences" in m]
    except (FileNotFoundError, ValueError):
        return []


def _explored(run_dir: str, since: float) -> int:
    """The explore step the explorer's saved position is at (its steps put so far), once written
    after `since` (the first launch's file stays until the resumed explorer writes its own)."""
    path = os.path.join(run_dir, "explorer", "explorer_state.json")
    try:
        if os.path.getmtime(path) < since:
            return -1
        with open(path) as f:
            return int(json.load(f)["explore_step"])
    except (FileNotFoundError, ValueError):
        return -1


def _tasks_of_an_uninterrupted_run(path: str) -> set[str]:
    """The task ids of the run's explore steps: what one that is never stopped trains."""
    from rlcore.core.config import load_config, resolve_stages
    from rlcore.core.data.taskset import task_stream

    stream = task_stream(resolve_stages(load_config(path, []))[0].config)
    return {task.task_id for step in range(STEPS) for task in stream.batch(step)}
