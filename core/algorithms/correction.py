"""Rollout-training mismatch correction: the engine that samples (another kernel, precision or
sampler) and the trainer that scores disagree token by token, so the experiences are slightly
off-policy even in lock-step. With r_t = pi_old(y_t) / pi_engine(y_t), the trainer's policy before
the update against the engine's log-probs that travel with every experience
(algorithm.rollout_correction):

    tis, token:       w_t = min(r_t, C)                       truncated IS (Yao et al. 2025, "Your
                                                              Efficient RL Framework Secretly Brings
                                                              You Off-Policy RL Training")
    tis, sequence:    w = min(prod_t r_t, C)                  one weight for the response's tokens
    tis, geometric:   w = min(exp(mean_t log r_t), C)
    mis, token:       keep y_t iff low <= r_t <= C            masked IS as verl's rejection sampling
    mis, sequence:    keep the response iff low <= prod_t r_t <= C        (rollout_rs token, sequence,
    mis, geometric:   keep it iff low <= exp(mean_t log r_t) <= C         geometric; Liu et al. 2025,
                                                                          "When Speed Kills Stability")

tis multiplies each trained token's policy-gradient term by its weight (IS_WEIGHT). mis weighs the
tokens it keeps 1 and takes the others out of the loss mask (ACCEPTED, then reject()): a rejected
token leaves every term of the loss (policy, KL, entropy; a critic's value loss) and the token and
response counts the loss divides by, as verl's modified response mask does; the step's rewards and
advantages are computed before, over every sampled token. With ratios [1.5, 3.0, 0.6, 1.0], C = 2 and
advantages 1 at pi = pi_old, the token-mean loss is -(1 + 1 + 1) / 3 = -1 (not -3 / 4: the rejected
token is not in the count either).

The weight is a constant (no gradient): it corrects the sampling distribution, while PPO's ratio
pi_theta / pi_old (the proximal policy) keeps its clip. It needs recomputed old log-probs: without
them pi_old is the engine's and r = 1. Metrics (rollout_correction/*, over the step's trained
tokens and responses before any rejection): the k3 estimate of KL(pi_engine || pi_old), mean
r - 1 - log r; the 5th, 50th and 95th percentiles of the token ratio; the share of tokens truncated
(tis: tokens_truncated) or rejected (mis: tokens_masked), and of responses with such a token
(seqs_truncated, seqs_masked).
"""

from __future__ import annotations

from typing import Any

import torch

IS_WEIGHT = "is_weight"
"""The micro-batch field [B, T] of each token's correction weight (PolicyLoss multiplies its terms)."""

ACCEPTED = "rs_accepted"
"""mis: the micro-batch field [B, T], 1 on the trained tokens rejection sampling keeps, until reject()
folds it into the loss mask (after the step's advantages are placed)."""

LOG_CAP = 20.0
"""Sequence log-ratios are clamped to +/- this before exp (a product of many ratios overflows)."""


def correction_weights(
    old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cfg: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] each token's weight, 0 off the mask: tis its truncated ratio, mis 1 where rejection
    sampling keeps it; [B, T] whether the token's weight was truncated or the token rejected), from
    [B, T] old and engine log-probs (`cfg`: RolloutCorrectionConfig, kind tis or mis)."""
    log_r = (old.double() - engine.double()) * mask
    if cfg.level == "token":
        log_w = log_r
    else:
        total = log_r.sum(-1, keepdim=True)
        if cfg.level == "geometric":
            total = total / mask.sum(-1, keepdim=True).clamp(min=1)
        log_w = total.clamp(-LOG_CAP, LOG_CAP).expand_as(log_r)
    ratio = log_w.exp()
    trained = mask > 0
    if cfg.kind == "tis":
        w = ratio.clamp(max=cfg.high)
        changed = (ratio > cfg.high) & trained
    else:
        low = cfg.low if cfg.low is not None else 1.0 / cfg.high
        kept = (ratio >= low) & (ratio <= cfg.high)
        w, changed = kept.double(), ~kept & trained
    return (w * mask).to(torch.float32), changed


def correct(batch: dict[str, torch.Tensor], old: torch.Tensor, cfg: Any) -> torch.Tensor:
    """Correct a micro-batch whose old_logprobs are still the engine's, by the recomputed `old`: tis
    writes IS_WEIGHT, mis marks the tokens it keeps (ACCEPTED). Returns [B, T] the tokens truncated
    or rejected."""
    w, changed = correction_weights(old, batch["old_logprobs"], batch["loss_mask"], cfg)
    batch[IS_WEIGHT if cfg.kind == "tis" else ACCEPTED] = w
    return changed


def reject(batch: dict[str, torch.Tensor]) -> None:
    """mis: the tokens rejection sampling did not keep leave the micro-batch's loss mask, so every
    loss term and count that reads it leaves them out (the loss normaliser counts the rows' masks:
    runtime/training.py reject_tokens)."""
    batch["loss_mask"] = batch["loss_mask"] * batch.pop(ACCEPTED)


class MismatchStats:
    """The step's mismatch over its micro-batches (this rank's rows), gathered over the
    data-parallel group for the metrics."""

    def __init__(self) -> None:
        self.log_r: list[torch.Tensor] = []
        self.changed_tokens = self.tokens = 0.0
        self.changed_seqs = self.seqs = 0.0

    def add(self, old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, changed: torch.Tensor) -> None:
        """A micro-batch: its [B, T] log-probs, loss mask and tokens truncated or rejected."""
        trained = mask > 0
        self.log_r.append((old.double() - engine.double())[trained].float().cpu())
        self.changed_tokens += float(changed.sum())
        self.tokens += float(trained.sum())
        rows = trained.any(-1)
        self.changed_seqs += float((changed.any(-1) & rows).sum())
        self.seqs += float(rows.sum())

    def metrics(self, group: Any, kind: str) -> dict[str, float]:
        import torch.distributed as dist

        mine = (torch.cat(self.log_r) if self.log_r else torch.zeros(0), self.changed_tokens, self.tokens,
                self.changed_seqs, self.seqs)  # fmt: skip
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, mine, group=group)
        log_r = torch.cat([p[0] for p in parts]).double()
        if log_r.numel() == 0:
            return {}
        ratio = log_r.exp()
        q = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
        what = "truncated" if kind == "tis" else "masked"
        tokens, seqs = sum(p[2] for p in parts), sum(p[4] for p in parts)
        return {
            "rollout_correction/k3_kl": float((ratio - 1 - log_r).mean()),
            "rollout_correction/ratio_p05": q[0],
            "rollout_correction/ratio_p50": q[1],
            "rollout_correction/ratio_p95": q[2],
            f"rollout_correction/tokens_{what}": sum(p[1] for p in parts) / max(tokens, 1.0),
            f"rollout_correction/seqs_{what}": sum(p[3] for p in parts) / max(seqs, 1.0),
        }
