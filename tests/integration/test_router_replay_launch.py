"""Rollout routing replay in a real launch (configs/qwen3_moe_r3.yaml, shortened): the bfloat16 HF
engine records every token's experts, the records cross the worker's gRPC stream to the float32
fsdp2 trainer, whose old-log-prob pass and update replay them on packed rows. The trainer reports
the share of replayed token routes its own router would have chosen otherwise: present at every
step (no record lost on the way) and small (the two dtypes disagree on near ties only)."""

from __future__ import annotations

import os

import pytest

from .launch_utils import REPO, launch, read_metrics

pytestmark = pytest.mark.integration


def test_the_engines_routing_is_replayed_by_the_trainer(tmp_path):
    root = str(tmp_path)
    cfg = {"base": os.path.join(REPO, "configs", "qwen3_moe_r3.yaml"), "checkpoint_root_dir": root,
           "project": "it", "name": "r3", "cluster": {"threads_per_rank": 1}}  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"), "stages.0.buffer.total_steps=20", "stages.1.buffer.total_steps=3",
           "stages.1.explorer.eval_on_startup=false", "stages.1.explorer.eval_interval=0", timeout_s=600)  # fmt: skip
    rl = read_metrics(os.path.join(root, "it", "r3", "stage1_rl"))
    assert [m["step"] for m in rl] == [1, 2, 3]
    for m in rl:
        assert 0.0 <= m["rollout/routing_mismatch"] < 0.05, m
        assert m["rollout/logprob_diff_mean"] < 0.05, m  # bfloat16 against float32, same routes
