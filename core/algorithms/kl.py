"""KL estimators between the policy and the reference model, the KL-penalised reward, and the
controllers that set the penalty's coefficient."""

from __future__ import annotations

from typing import Any

import torch

from ..config.schema import KLControllerConfig

KL_ESTIMATORS = ("k1", "abs", "k2", "mse", "k3", "low_var_kl")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the log-probs of the sampled tokens.

    k1 = lp - ref (unbiased, high variance, can be negative); abs = |lp - ref|; k2 (mse) =
    0.5 (lp - ref)^2; k3 (low_var_kl) = exp(ref - lp) - (ref - lp) - 1 (unbiased, non-negative, low
    variance), clamped to [-10, 10] so a few far-off tokens cannot dominate.
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("k2", "mse"):
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        # Any |x| > 20 already lands at the clamp value 10; bounding x first keeps exp finite, so the
        # backward pass never meets 0 * inf = nan.
        x = (-diff).clamp(-20.0, 20.0)
        return (torch.exp(x) - x - 1).clamp(-10.0, 10.0)
    raise ValueError(f"kl estimator must be one of {', '.join(KL_ESTIMATORS)}; got '{kind}'")


def kl_penalized_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    kind: str,
    coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract `coef` times each sequence's summed token KL from its score.

    Returns (penalised scores [B], per-sequence KL [B]); the KL is what a KL controller is fed.
    """
    kl_B = (kl_estimate(logprobs, ref_logprobs, kind) * loss_mask).sum(-1)
    return scores - coef * kl_B, kl_B


class FixedKLController:
    """A KL coefficient that never changes."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.value = float(d["value"])


class AdaptiveKLController:
    """Proportional controller that moves the coefficient so the observed KL approaches `target_kl`
    (Ziegler et al. 2019): at most a 20% relative error is acted on, spread over `horizon` samples."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = float(init_kl_coef)
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """`n_steps`: samples (sequences) that produced `current_kl`."""
        err = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.value = float(d["value"])


KLController = FixedKLController | AdaptiveKLController


def build_kl_controller(cfg: KLControllerConfig) -> KLController:
    if cfg.type == "fixed":
        return FixedKLController(cfg.kl_coef)
    if cfg.type == "adaptive":
        return AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.horizon)
    raise ValueError(f"algorithm.kl_ctrl.type must be one of fixed, adaptive; got '{cfg.type}'")
