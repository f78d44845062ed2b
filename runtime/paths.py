"""The run folder's layout, in one place. A run lives in checkpoint_root_dir/project/name (`run_dir`):

    launch/                   the launch's plan.json, logs and failure reports
    <stage folder>/           the run folder itself for one stage, else stage<i>_<name>/ per stage:
        stage_summary.json    the stage's end (a resumed launch skips a finished stage)
        published/            the weights a trainer publishes for an explorer (version_N/)
        explorer/             an asynchronous stage's explorer thread: its metrics and position
    explorer/                 a mode-explore launch's own run folder (its stage folders inside)
    buffer/                   the file and sql experience buffers, and a served queue's address
"""

from __future__ import annotations

import os
from typing import Any

from ..buffer import project_dir as run_dir
from ..core.config import Stage

SUMMARY = "stage_summary.json"
PUBLISHED = "published"
EXPLORER_DIR = "explorer"
LAUNCH_DIR = "launch"

__all__ = ["EXPLORER_DIR", "LAUNCH_DIR", "PUBLISHED", "SUMMARY", "published_dir", "run_dir", "stage_dir", "trainer_stage_dir"]


def stage_dir(run_folder: str, stage: Stage, num_stages: int) -> str:
    """A stage's folder in `run_folder`: the run folder itself when the run has one stage."""
    return run_folder if num_stages == 1 else os.path.join(run_folder, f"stage{stage.index}_{stage.name}")


def published_dir(trainer_stage_dir: str) -> str:
    """Where the trainer of a stage publishes its weights for the explorers."""
    return os.path.join(trainer_stage_dir, PUBLISHED)


def trainer_stage_dir(cfg: Any, stage: Stage, num_stages: int) -> str:
    """The mode-train launch's folder of `stage` (the run folder both launches share)."""
    return stage_dir(run_dir(cfg), stage, num_stages)
