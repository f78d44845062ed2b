"""Policy-gradient terms that weight by the importance ratio r = pi / pi_old without PPO's min (the
losses a Tinker client names, runtime/tinker):

- importance_sampling: -r A, unclipped (the policy gradient of samples drawn by pi_old, reweighted
  to pi);
- cispo (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585): the ratio clipped to
  [1 - clip_ratio_low, 1 + clip_ratio_high] and detached weights the log-prob's gradient,
  -sg(clip(r)) A log pi: every token keeps a gradient, only its weight is bounded.

Same signature as losses.ppo_clip_terms: per-token loss and clipped indicator, [B, T] each."""

from __future__ import annotations

import torch

from ..config.schema import AlgorithmConfig


def importance_sampling_terms(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    return -adv * torch.exp(logprobs - old), torch.zeros_like(logprobs)


def cispo_terms(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    low, high = cfg.clip_ratio_low, cfg.clip_ratio_high
    assert low is not None and high is not None, "with_preset fills them"
    ratio = torch.exp(logprobs - old).detach()
    weight = ratio.clamp(1.0 - low, 1.0 + high)
    return -weight * adv * logprobs, (weight != ratio).float()
