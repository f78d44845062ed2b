"""Loss functions the training strategies call on each micro-batch (the `LossFn` protocol of
backends/base.py). Loss and metrics are the micro-batch's share of the train-batch value (see
aggregation.py), so strategies just sum them."""

from __future__ import annotations

import torch

from ..config.schema import AlgorithmConfig
from . import kl_in_loss, policy_terms_of, with_preset
from .aggregation import LossNorm, aggregate, check_loss_agg_mode
from .correction import IS_WEIGHT
from .kl import kl_estimate

Batch = dict[str, torch.Tensor]


def _to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    # one device->host copy for all metrics instead of one sync per .item()
    values = torch.stack([v.detach().float() for v in metrics.values()]).tolist()
    return dict(zip(metrics, values, strict=True))


def ppo_clip_terms(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token (Schulman et al. 2017, arXiv:1707.06347), with an
    asymmetric clip range (DAPO's clip-higher): max(-A r, -A clip(r, 1 - low, 1 + high)), r = pi / pi_old.
    With clip_ratio_c (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729) a token whose advantage is
    negative loses at most -A c however large r grows. Per-token loss and clipped indicator, [B, T] each."""
    assert cfg.clip_ratio_low is not None and cfg.clip_ratio_high is not None, "with_preset fills them"
    ratio = torch.exp(logprobs - old)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if cfg.clip_ratio_c is not None:
        cap = -adv * cfg.clip_ratio_c
        dual = (adv < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped.float()


class PolicyLoss:
    """The algorithm's policy-gradient terms (algorithm.policy_loss_fn: ppo_clip, gspo) plus an
    optional KL loss against the reference model and an optional entropy bonus."""

    def __init__(self, cfg: AlgorithmConfig, norm: LossNorm):
        cfg = with_preset(cfg)
        assert cfg.loss_agg_mode is not None and cfg.policy_loss_fn is not None, "with_preset fills them"
        check_loss_agg_mode(cfg.loss_agg_mode)
        self.cfg, self.mode = cfg, cfg.loss_agg_mode
        self.norm = norm
        self.terms = policy_terms_of(cfg.policy_loss_fn)
        self.needs_entropy = cfg.entropy_coef > 0

    @property
    def needs_reference(self) -> bool:
        return kl_in_loss(self.cfg)

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, norm, mode = self.cfg, self.norm, self.mode
        mask, adv, old = batch["loss_mask"], batch["advantages"], batch["old_logprobs"]

        pg, clipped = self.terms(logprobs, old, adv, mask, cfg)
        if IS_WEIGHT in batch:  # rollout correction: the engine sampled these tokens (correction.py)
            pg = pg * batch[IS_WEIGHT]
        pg_loss = aggregate(pg, mask, mode, norm)
        loss = pg_loss
        metrics = {
            "actor/pg_loss": pg_loss,
            "actor/pg_clipfrac": aggregate(clipped, mask, "token-mean", norm),
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
        return SFTLoss(norm, with_preset(cfg).loss_agg_mode)
    return PolicyLoss(cfg, norm)
