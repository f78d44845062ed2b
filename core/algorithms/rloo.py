"""RLOO advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs", arXiv:2402.14740; Kool et al. 2019's leave-one-out
baseline): each response's baseline is the mean reward of the OTHER responses to its task,

    A_i = r_i - 1/(n-1) * sum_{j != i} r_j = n/(n-1) * (r_i - mean(r_group)),

an unbiased baseline (it does not depend on r_i). A group of one has no other response: A = 0."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .grpo import group_centred


def rloo_advantages(rewards: torch.Tensor, group_ids: Sequence[str]) -> torch.Tensor:
    assert rewards.dim() == 1 and len(group_ids) == rewards.shape[0], "one group id per reward"
    centred, n, _ = group_centred(rewards, group_ids)
    return (centred * n / (n - 1).clamp(min=1)).to(rewards.dtype)
