"""A run that fails tells the user in one line (stderr has exactly one line) what failed, where, and
which file holds the full traceback; the ranks' tracebacks and torchrun's report go to the run's
trainer log instead of the terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from tests.integration.launch_utils import REPO, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _launch(root: str, cfg: dict) -> subprocess.Popen:
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _the_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def _traceback_file(line: str) -> str:
    path = re.search(r"full traceback in (\S+)\)$", line).group(1)
    with open(path) as f:
        assert "Traceback (most recent call last)" in f.read()
    return path


def test_a_failing_reward_function_is_one_line_naming_it_and_the_task(tmp_path) -> None:
    """One that fails on the first row is refused before anything starts (tests/unit/test_cli.py);
    this one fails on a rollout worker, later rows only."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{"buffer.explorer_input.taskset.reward_fn": ["tests.integration.rewards:fails_past_the_first_row"]},
    )
    proc = _launch(root, cfg)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    line = _the_line(err)
    assert (
        line.startswith("rlcore: error: ")
        and "reward_fn 'tests.integration.rewards:fails_past_the_first_row' failed on task" in line
    )
    _traceback_file(line)
    with open(os.path.join(root, "it", "run", "launch", "trainer.log")) as f:
        assert "Traceback" in f.read()  # the ranks' stderr is kept, just not shown


def test_a_dead_rollout_worker_is_one_line_naming_it(tmp_path) -> None:
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{
            "buffer.total_epochs": 50, "buffer.total_steps": 500, "explorer.max_retry_times": 0,
            # with restarts the step would wait for the launch's (test_worker_failover.py)
            "explorer.rollout_model.max_restarts": 0,
        },
    )  # fmt: skip
    proc = _launch(root, cfg)
    metrics = os.path.join(root, "it", "run", "metrics.jsonl")
    deadline = time.monotonic() + 180
    while not (os.path.exists(metrics) and os.path.getsize(metrics)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    worker = next(
        p
        for p in psutil.process_iter(["cmdline"])
        if "rollout" in (p.info["cmdline"] or []) and root in " ".join(p.info["cmdline"])
    )
    worker.kill()
    _, err = proc.communicate(timeout=180)
    assert proc.returncode != 0
    line = _the_line(err)
    # the only worker: nothing to fail over to (noticed by a rollout, or by the sync after a step)
    assert re.match(
        r"rlcore: error: RuntimeError: no rollout worker answers: 127\.0\.0\.1:\d+ stopped", line
    ), line
    _traceback_file(line)
