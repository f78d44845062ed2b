"""The importance-weighted policy terms (core/algorithms/importance.py): values and gradients
against their formulas."""

from __future__ import annotations

import torch

from rlcore.core.algorithms import POLICY_LOSS_FNS
from rlcore.core.config.schema import AlgorithmConfig


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    old = -2.0 + 0.5 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    logprobs = (old + 0.6 * torch.randn(3, 5, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    return logprobs, old, adv, torch.ones(3, 5, dtype=torch.float64)


def test_importance_sampling_is_the_unclipped_ratio_weighted_gradient() -> None:
    logprobs, old, adv, mask = _inputs()
    loss, clipped = POLICY_LOSS_FNS.resolve("importance_sampling")(logprobs, old, adv, mask, AlgorithmConfig())
    ratio = torch.exp(logprobs.detach() - old)
    assert torch.allclose(loss, -adv * ratio) and not clipped.any()
    loss.sum().backward()
    assert torch.allclose(logprobs.grad, -adv * ratio)  # d/dlp of -A exp(lp - old)


def test_cispo_bounds_the_weight_not_the_gradient() -> None:
    logprobs, old, adv, mask = _inputs()
    cfg = AlgorithmConfig(clip_ratio_low=0.1, clip_ratio_high=0.2)
    loss, clipped = POLICY_LOSS_FNS.resolve("cispo")(logprobs, old, adv, mask, cfg)
    ratio = torch.exp(logprobs.detach() - old)
    weight = ratio.clamp(0.9, 1.2)
    assert torch.allclose(loss, -weight * adv * logprobs.detach())
    assert torch.equal(clipped.bool(), (ratio < 0.9) | (ratio > 1.2)) and clipped.any() and not clipped.all()
    loss.sum().backward()
    assert torch.allclose(logprobs.grad, -weight * adv)  # every token keeps a gradient, even clipped ones
