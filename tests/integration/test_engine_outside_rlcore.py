"""Adding an engine takes one module and its name: tests/integration/plain_engine.py, written outside
rlcore, selected by import path, with an option of its own, serves a launch's rollout worker (the
launcher hands the worker the resolved engine as one argument) and takes each step's weights."""

from __future__ import annotations

import os

import pytest

from tests.integration.launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_an_engine_written_outside_rlcore_serves_a_launch_with_its_own_option(tmp_path):
    root = str(tmp_path / "run")
    cfg = tiny_grpo_config(root, **{
        "explorer.rollout_model.engine_type": "tests.integration.plain_engine:PlainEngine",
        "explorer.rollout_model.engine_options": {"response_cap": 3},
        "buffer.total_steps": 2,
    })  # fmt: skip
    launch(cfg, root + ".yaml")
    rows = [m for m in read_metrics(os.path.join(root, "it", "run")) if "actor/loss" in m]
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        # max_tokens is 8: the engine's own option capped every response
        assert 0 < m["rollout/response_len_mean"] <= 3, m
        # the engine's log-probs are the trainer's: step 2 sampled with the weights step 1 sent it
        assert m["rollout/logprob_diff_max"] <= 1e-4, m
