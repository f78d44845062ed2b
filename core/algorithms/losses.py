"""Loss functions the training strategies call on each micro-batch (the `LossFn` protocol of
backends/base.py). Loss and metrics are the micro-batch's share of the train-batch value (see
aggregation.py), so strategies just sum them."""

from __future__ import annotations

import torch

from ..config.schema import AlgorithmConfig
from .aggregation import LossNorm, aggregate, check_loss_agg_mode
from .kl import kl_estimate

Batch = dict[str, torch.Tensor]


def _to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    # one device->host copy for all metrics instead of one sync per .item()
    values = torch.stack([v.detach().float() for v in metrics.values()]).tolist()
    return dict(zip(metrics, values, strict=True))


class PolicyLoss:
    """PPO clipped surrogate (asymmetric clip range, as in DAPO's clip-higher) plus an optional KL
    loss against the reference model and an optional entropy bonus."""

    def __init__(self, cfg: AlgorithmConfig, norm: LossNorm):
        check_loss_agg_mode(cfg.loss_agg_mode)
        self.cfg = cfg
        self.norm = norm
        self.needs_entropy = cfg.entropy_coef > 0

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_loss_fn != "none" and self.cfg.kl_loss_coef > 0

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, norm, mode = self.cfg, self.norm, self.cfg.loss_agg_mode
        mask, adv, old = batch["loss_mask"], batch["advantages"], batch["old_logprobs"]

        ratio = torch.exp(logprobs - old)
        pg_unclipped = -adv * ratio
        pg_clipped = -adv * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
        pg_loss = aggregate(torch.maximum(pg_unclipped, pg_clipped), mask, mode, norm)
        loss = pg_loss
        metrics = {
            "actor/pg_loss": pg_loss,
            "actor/pg_clipfrac": aggregate((pg_clipped > pg_unclipped).float(), mask, "token-mean", norm),
            "actor/ppo_kl": aggregate(old - logprobs, mask, "token-mean", norm),
        }
        if self.needs_reference:
            kl = kl_estimate(logprobs, batch["ref_logprobs"], cfg.kl_loss_fn)
            kl_loss = aggregate(kl, mask, mode, norm)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss
        assert entropy is not None or not self.needs_entropy, "entropy_coef > 0 needs the entropy"
        if entropy is not None:
            entropy_agg = aggregate(entropy, mask, mode, norm)
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * entropy_agg
            metrics["actor/entropy"] = entropy_agg
        metrics["actor/loss"] = loss
        return loss, _to_floats(metrics)


class SFTLoss:
    """Negative log-likelihood of the response tokens."""

    needs_entropy = False
    needs_reference = False

    def __init__(self, norm: LossNorm, loss_agg_mode: str = "token-mean"):
        check_loss_agg_mode(loss_agg_mode)
        self.norm = norm
        self.loss_agg_mode = loss_agg_mode

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = aggregate(-logprobs, batch["loss_mask"], self.loss_agg_mode, self.norm)
        return loss, _to_floats({"sft/loss": loss})


def build_loss(cfg: AlgorithmConfig, norm: LossNorm) -> PolicyLoss | SFTLoss:
    if cfg.algorithm_type == "sft":
        return SFTLoss(norm, cfg.loss_agg_mode)
    return PolicyLoss(cfg, norm)
