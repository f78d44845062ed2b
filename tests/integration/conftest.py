"""Fixtures shared by integration test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator

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


@pytest.fixture(scope="module")
def tinker_server(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`rlcore tinker serve` of the scratch model for a test module (tinker_serving.py): its URL."""
    from .tinker_serving import serve

    proc, url = serve(str(tmp_path_factory.mktemp("tinker")), tiny_model_path)
    yield url
    proc.terminate()
    proc.wait(60)
