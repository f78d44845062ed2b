"""REINFORCE++ with a group baseline (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for
Aligning Large Language Models", arXiv:2501.03262): the group mean is subtracted from each reward,
then the advantages are normalised over the whole batch,

    a_i = r_i - mean(r_group),   A_i = (a_i - mean(a)) / (std(a) + eps),

so the advantage scale does not depend on how spread one group's rewards are (GRPO's per-group std
does). Normalised over responses, each response counting once (verl normalises over tokens, which
weighs long responses more). The token-level REINFORCE++ (KL in the reward, discounted returns) is
not built yet."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .grpo import group_centred


def reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor, group_ids: Sequence[str], eps: float = 1e-6
) -> torch.Tensor:
    assert rewards.dim() == 1 and len(group_ids) == rewards.shape[0], "one group id per reward"
    centred, _, _ = group_centred(rewards, group_ids)
    if centred.numel() < 2:
        return torch.zeros_like(rewards)
    return ((centred - centred.mean()) / (centred.std() + eps)).to(rewards.dtype)
