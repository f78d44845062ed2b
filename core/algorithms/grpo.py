"""GRPO and Dr. GRPO advantages: one scalar per response, relative to the other responses to the
same task (its group), broadcast over the response's tokens by the trainer.

GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): A_i = (r_i - mean(r_group)) / (std(r_group) + eps).
Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783): A_i = r_i - mean(r_group),
with the loss summed over tokens and divided by a constant budget (seq-mean-token-sum-norm): the
std division and per-response length normalisation both bias the gradient.

Normalisation: the std is the group's unbiased one (torch.std). The grpo preset aggregates the loss
with token-mean over the whole train batch, as verl and TRL do by default (DAPO's token-level loss),
not with GRPO's equation, 1/G sum_i 1/|o_i| sum_t (each response's token mean, then the mean over
responses): that one is loss_agg_mode seq-mean-token-mean."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .scored import ScoredBatch


def grpo_advantages(batch: ScoredBatch, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: (r - group mean) / (group std + eps), or r - group mean.

    Responses to the same task share a group id; the group mean is the baseline, so no value model is
    needed. std is the unbiased one (torch.std); `std_normalize=False` is Dr. GRPO, which drops the
    division because it up-weights groups whose rewards barely differ. A group of one has no baseline
    and gets advantage 0.
    """
    rewards = batch.rewards
    # sums of many rewards: accumulate in float64, return in the input dtype
    adv, count_N, group_N = group_centred(rewards, batch.group_ids)  # exactly 0 for a group of one
    if std_normalize:
        var_N = group_sum(adv.square(), group_N) / (count_N - 1).clamp(min=1)
        adv = adv / (var_N.sqrt() + eps)
    return adv.to(rewards.dtype)


def dr_grpo_advantages(batch: ScoredBatch) -> torch.Tensor:
    """Dr. GRPO: the group-centred reward, without the division by the group's std."""
    return grpo_advantages(batch, std_normalize=False)


def group_sum(values: torch.Tensor, group_N: torch.Tensor) -> torch.Tensor:
    """For each response, the sum of `values` over its group (`group_N`: group indices 0..G-1)."""
    return values.new_zeros(int(group_N.max()) + 1).index_add(0, group_N, values)[group_N]


def group_max(values: torch.Tensor, group_N: torch.Tensor) -> torch.Tensor:
    """For each response, the largest of `values` in its group."""
    peak = values.new_zeros(int(group_N.max()) + 1).scatter_reduce(
        0, group_N, values, "amax", include_self=False
    )
    return peak[group_N]


def group_centred(
    rewards: torch.Tensor, group_ids: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r - group mean, group size, group index 0..G-1) of each response, in float64."""
    index_of = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    group_N = torch.tensor([index_of[g] for g in group_ids], device=rewards.device)
    r = rewards.double()
    count_N = group_sum(torch.ones_like(r), group_N)
    return r - group_sum(r, group_N) / count_N, count_N, group_N
