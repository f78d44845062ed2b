"""OPMD, online policy mirror descent, as Trinity-RFT defines it (github.com/modelscope/Trinity-RFT:
trinity/algorithm/advantage_fn/opmd_advantage.py, policy_loss_fn/opmd_policy_loss.py): a
KL-regularised policy update taken as a REINFORCE step with a group baseline and no importance ratio,

    A_i = r_i - b_group,   b = mean(r_group)                               (opmd.baseline: mean)
                           b = tau * log( 1/K sum_j exp(r_j / tau) )       (opmd.baseline: logavgexp)
    loss = 1/(1 + tau) * aggregate_t( -A_i * log pi(y_t) ),

tau (algorithm.opmd.tau) being the strength of the mirror-descent regulariser. No std division; a
group of one has no baseline and gets advantage 0. The old log-probs are not used (no ratio, no
clip), so the loss is the same on and off policy."""

from __future__ import annotations

import torch

from ..config.schema import AlgorithmConfig
from .grpo import group_centred, group_max, group_sum
from .scored import ScoredBatch


def opmd_advantages(batch: ScoredBatch) -> torch.Tensor:
    """[N] r_i minus its group's mean or tau-log-average-exp (module docstring)."""
    cfg = batch.cfg
    centred, count_N, group_N = group_centred(batch.rewards, batch.group_ids)
    if cfg is not None and cfg.opmd.baseline == "logavgexp":
        tau = cfg.opmd.tau
        r = batch.rewards.double()
        # shifted by the group max so exp cannot overflow: b = m + tau log(mean exp((r - m) / tau))
        peak = group_max(r, group_N)
        baseline = peak + tau * (group_sum(torch.exp((r - peak) / tau), group_N) / count_N).log()
        centred = r - baseline
    return torch.where(count_N > 1, centred, torch.zeros_like(centred)).to(batch.rewards.dtype)


def opmd_terms(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -A log pi / (1 + tau); nothing is clipped."""
    return -adv * logprobs / (1.0 + cfg.opmd.tau), torch.zeros_like(logprobs)
