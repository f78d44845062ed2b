"""Fixtures shared by integration test modules."""

from __future__ import annotations

import os

import pytest

from tests.integration.launch_utils import launch
from tests.integration.quickstart_runs import RL_STEPS, SFT_STEPS, quickstart


@pytest.fixture(scope="session")
def one_host(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shortened quickstart on one host, uninterrupted (two ranks, a rollout worker the launch
    starts): the run folder that multi-host and restarted runs are compared with, step for step."""
    root = str(tmp_path_factory.mktemp("one_host"))
    cfg = quickstart(root, SFT_STEPS, RL_STEPS)
    cfg["cluster"]["ranks_per_node"] = 2
    launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=600)
    return os.path.join(root, "quickstart", "arithmetic")
