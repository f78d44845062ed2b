"""trainer.max_restarts: a trainer world that fails is restarted and resumes from its last
checkpoint, training no step twice (the per-step numbers of a run that never failed)."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from tests.integration.launch_utils import REPO
from tests.integration.quickstart_runs import (
    RL_STEPS,
    SFT_STEPS,
    logged,
    quickstart,
    same_training,
    trainer_rank,
)


def test_a_failed_trainer_world_restarts_from_its_checkpoint_and_trains_no_step_twice(tmp_path, one_host) -> None:
    """Rank 1 killed mid-GRPO fails the world; torchrun restarts both ranks, which resume from the
    last checkpoint (every 2 steps) with the rollout worker that kept running; the run then matches
    an uninterrupted one (`one_host`, conftest.py) step for step, each step logged once."""
    cfg = quickstart(str(tmp_path / "restarted"), SFT_STEPS, RL_STEPS)
    cfg["cluster"]["ranks_per_node"] = 2
    cfg["trainer"].update(save_interval=2, max_restarts=1)
    path = str(tmp_path / "restarted.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    run_dir = os.path.join(cfg["checkpoint_root_dir"], "quickstart", "arithmetic")
    with open(tmp_path / "out.log", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        import time

        deadline = time.monotonic() + 300
        while not logged(run_dir, "stage1_rl", 3):
            assert proc.poll() is None and time.monotonic() < deadline, open(tmp_path / "out.log").read()
            time.sleep(0.1)
        trainer_rank(cfg["checkpoint_root_dir"], 1).kill()
        assert proc.wait(timeout=600) == 0, open(tmp_path / "out.log").read()
    finally:
        if proc.poll() is None:
            proc.kill()
    output = open(tmp_path / "out.log").read()
    assert (
        "trainer world restart 1 of 1 (trainer.max_restarts): resuming from the last checkpoint" in output
    ), output
    assert "the trainer world failed (trainer rank 1 (pid " in output and "ended by SIGKILL" in output, output
    assert output.count("rollout workers ready") == 1  # the worker served both worlds
    same_training(one_host, run_dir)
