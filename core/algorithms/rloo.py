"""RLOO advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs", arXiv:2402.14740; Kool et al. 2019's leave-one-out
baseline): each response's baseline is the mean reward of the OTHER responses to its task,

    A_i = r_i - 1/(n-1) * sum_{j != i} r_j = n/(n-1) * (r_i - mean(r_group)),

an unbiased baseline (it does not depend on r_i). A group of one has no other response: A = 0."""

from __future__ import annotations

import torch

from .grpo import group_centred
from .scored import ScoredBatch


def rloo_advantages(batch: ScoredBatch) -> torch.Tensor:
    centred, n, _ = group_centred(batch.rewards, batch.group_ids)
    return (centred * n / (n - 1).clamp(min=1)).to(batch.rewards.dtype)
