"""Advantage estimators: turn one scalar reward per experience into one advantage per experience
(the trainer broadcasts it over the response tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def grpo_advantages(
    rewards: torch.Tensor, group_ids: Sequence[str], std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages: (r - group mean) / (group std + eps), or r - group mean.

    Responses to the same task share a group id; the group mean is the baseline, so no value model is
    needed. std is the unbiased one (torch.std); `std_normalize=False` is Dr. GRPO, which drops the
    division because it up-weights groups whose rewards barely differ. A group of one has no baseline
    and gets advantage 0.
    """
    assert rewards.dim() == 1 and len(group_ids) == rewards.shape[0], "one group id per reward"
    index_of = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    group_N = torch.tensor([index_of[g] for g in group_ids], device=rewards.device)
    r = rewards.double()  # sums of many rewards: accumulate in float64, return in the input dtype
    zeros_G = torch.zeros(len(index_of), dtype=r.dtype, device=r.device)
    count_G = zeros_G.index_add(0, group_N, torch.ones_like(r))
    mean_G = zeros_G.index_add(0, group_N, r) / count_G
    adv = r - mean_G[group_N]  # exactly 0 for a group of one
    if std_normalize:
        var_G = zeros_G.index_add(0, group_N, adv.square()) / (count_G - 1).clamp(min=1)
        adv = adv / (var_G.sqrt()[group_N] + eps)
    return adv.to(rewards.dtype)
