"""GSPO's policy-gradient terms (Zheng et al. 2025, "Group Sequence Policy Optimization",
arXiv:2507.18071): the importance ratio is the sequence's, length-normalised,

    s_i = (pi(y_i) / pi_old(y_i)) ^ (1/|y_i|) = exp(mean_t log pi(y_t) - log pi_old(y_t)),

and the clip acts on whole sequences: loss_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i).
Written per token (GSPO-token) so the usual aggregation applies: every token of a sequence carries
s_i_t = sg[s_i] * pi(y_t) / sg[pi(y_t)], whose value is s_i and whose gradient is s_i * grad log pi(y_t);
with seq-mean-token-mean this is exactly GSPO's gradient. Its paper's clip range is (3e-4, 4e-4)."""

from __future__ import annotations

import torch

from ..config.schema import AlgorithmConfig


def gspo_terms(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and clipped indicator, [B, T] each (see the module docstring)."""
    low, high = cfg.clip_ratio_low, cfg.clip_ratio_high
    assert low is not None and high is not None, "with_preset fills them"
    lengths = mask.sum(-1).clamp(min=1)
    seq_log_ratio = ((logprobs - old) * mask).sum(-1) / lengths  # [B]
    ratio = torch.exp(
        seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    )  # value s_i per token
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()
