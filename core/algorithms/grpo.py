"""GRPO and Dr. GRPO advantages: one scalar per response, relative to the other responses to the
same task (its group), broadcast over the response's tokens by the trainer.

GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): A_i = (r_i - mean(r_group)) / (std(r_group) + eps).
Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783): A_i = r_i - mean(r_group),
with the loss summed over tokens and divided by a constant budget (seq-mean-token-sum-norm): the
std division and per-response length normalisation both bias the gradient."""

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
    # sums of many rewards: accumulate in float64, return in the input dtype
    adv, count_N = group_centred(rewards, group_ids)  # exactly 0 for a group of one
    if std_normalize:
        group_N, num_groups = group_index(group_ids, rewards.device)
        zeros_G = torch.zeros(num_groups, dtype=adv.dtype, device=adv.device)
        var_G = zeros_G.index_add(0, group_N, adv.square())[group_N] / (count_N - 1).clamp(min=1)
        adv = adv / (var_G.sqrt() + eps)
    return adv.to(rewards.dtype)


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: Sequence[str]) -> torch.Tensor:
    """Dr. GRPO: the group-centred reward, without the division by the group's std."""
    return grpo_advantages(rewards, group_ids, std_normalize=False)


def group_index(group_ids: Sequence[str], device: torch.device) -> tuple[torch.Tensor, int]:
    """Each response's group as an index 0..G-1 (in order of first appearance), and G."""
    index_of = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
    return torch.tensor([index_of[g] for g in group_ids], device=device), len(index_of)


def group_centred(rewards: torch.Tensor, group_ids: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(r - group mean, group size of each response), in float64."""
    group_N, num_groups = group_index(group_ids, rewards.device)
    r = rewards.double()
    zeros_G = torch.zeros(num_groups, dtype=r.dtype, device=r.device)
    count_G = zeros_G.index_add(0, group_N, torch.ones_like(r))
    mean_G = zeros_G.index_add(0, group_N, r) / count_G
    return r - mean_G[group_N], count_G[group_N]
