"""An RL algorithm written outside rlcore, in one module: a response's advantage is its reward less
its group's mean reward (a group-mean baseline, not divided by the group's spread), trained with
PPO's clipped loss averaged over tokens. `algorithm.algorithm_type:
tests.integration.mean_baseline_algorithm:MEAN_BASELINE` selects it, on rlcore's own trainer and on a
Tinker service alike (its loss is one a Tinker service computes).

For its test (test_tinker_server.py): each step's rewards, groups and advantages are appended to the
file RLCORE_TEST_ADVANTAGES names, when set.
"""

from __future__ import annotations

import json
import os

import torch

from rlcore.core.algorithms import Algorithm
from rlcore.core.algorithms.scored import ScoredBatch


def mean_baseline_advantages(batch: ScoredBatch) -> torch.Tensor:
    """[N] reward - the mean reward of the response's group."""
    members: dict[str, list[int]] = {}
    for i, group in enumerate(batch.group_ids):
        members.setdefault(group, []).append(i)
    advantages = torch.empty_like(batch.rewards)
    for rows in members.values():
        advantages[rows] = batch.rewards[rows] - batch.rewards[rows].mean()
    if path := os.environ.get("RLCORE_TEST_ADVANTAGES"):
        record = {"rewards": batch.rewards.tolist(), "groups": list(batch.group_ids), "advantages": advantages.tolist()}
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    return advantages


MEAN_BASELINE = Algorithm(
    f"{__name__}:mean_baseline_advantages",
    "ppo_clip",
    defaults={
        "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "use_kl_in_reward": False,
        "overlong_filter": False, "dynamic_sampling": False, "distill_coef": 0.0,
    },
)  # fmt: skip
