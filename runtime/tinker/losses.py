"""Tinker's loss functions as rlcore's trainer losses (TrainerService.ForwardBackward).

Tinker sums every loss over tokens and datums; rlcore's trainer normalises by the token count it
is given, so every request goes with normalize_tokens 1. Per loss (lp: the learner's log-prob of a
target, slp: the sampler's, `logprobs` in loss_fn_inputs; r = exp(lp - slp)):

    cross_entropy        -sum(weights * lp)                     rlcore cross_entropy, loss_mask = weights
    importance_sampling  -sum(r * advantages)                   rlcore importance_sampling
    ppo                  -sum(min(r A, clip(r, lo, hi) A))      rlcore ppo, clip 1 - lo, hi - 1
    cispo                -sum(sg(clip(r, lo, hi)) * lp * A)     rlcore cispo, clip 1 - lo, hi - 1
    gspo                 ppo on the sequence's length-normalised ratio (the positions of
                         sequence_ratio_mask, else those with a nonzero advantage)

lo and hi are loss_fn_config's clip_low_threshold and clip_high_threshold (0.8 and 1.2 unless
given). Policy losses train every position (a zero advantage adds nothing). dro, stable_reinforce
and custom are not served: a UserError names them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...client.trainer import TrainSequence
from .errors import UserError
from .wire import Datum

POLICY = {"importance_sampling": (), "ppo": ("clip",), "cispo": ("clip",), "gspo": ("clip",)}
"""Policy losses (the same name in rlcore) and whether they take clip thresholds."""
SERVED = ("cross_entropy", *POLICY)
INPUTS = {"cross_entropy": ("target_tokens", "weights")}
POLICY_INPUTS = ("target_tokens", "logprobs", "advantages")
CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


@dataclass
class LossPlan:
    """One ForwardBackward of rlcore's trainer."""

    loss: str
    sequences: list[TrainSequence]
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None


def required_inputs(loss_fn: str) -> tuple[str, ...]:
    if loss_fn not in SERVED:
        raise UserError(f"loss_fn: {loss_fn} is not served here; served: {', '.join(SERVED)}")
    return INPUTS.get(loss_fn, POLICY_INPUTS)


def plan_loss(loss_fn: str, config: dict[str, float], datums: list[Datum]) -> LossPlan:
    """The trainer request of `loss_fn` over `datums` (checked by required_inputs first)."""
    if loss_fn == "cross_entropy":
        unknown = sorted(config)
        if unknown:
            raise UserError(f"loss_fn_config: {', '.join(unknown)} not taken by cross_entropy")
        seqs = []
        for d, datum in enumerate(datums):
            weights = datum.inputs["weights"].astype(np.float64)
            if weights.min() < 0 or weights.max() > 1:
                raise UserError(f"data[{d}].loss_fn_inputs.weights: rlcore trains weights in [0, 1]; got "
                                f"{weights.min():g}..{weights.max():g}")  # fmt: skip
            seqs.append(TrainSequence(datum.prompt, datum.response, loss_mask=weights.tolist()))
        return LossPlan("cross_entropy", seqs)
    takes = POLICY[loss_fn]
    unknown = sorted(k for k in config if not ("clip" in takes and k in CLIP_DEFAULTS))
    if unknown:
        raise UserError(f"loss_fn_config: {', '.join(unknown)} not taken by {loss_fn} "
                        f"(it takes {', '.join(CLIP_DEFAULTS) if takes else 'nothing'})")  # fmt: skip
    plan = LossPlan(loss_fn, [])
    if takes:
        low = config.get("clip_low_threshold", CLIP_DEFAULTS["clip_low_threshold"])
        high = config.get("clip_high_threshold", CLIP_DEFAULTS["clip_high_threshold"])
        if not 0 < low <= 1:
            raise UserError(f"loss_fn_config.clip_low_threshold: must be in (0, 1]; got {low}")
        if not high >= 1:
            raise UserError(f"loss_fn_config.clip_high_threshold: must be >= 1; got {high}")
        plan.clip_ratio_low, plan.clip_ratio_high = 1.0 - low, high - 1.0
    for datum in datums:
        adv = datum.inputs["advantages"].astype(np.float64)
        mask = np.ones_like(adv)
        if loss_fn == "gspo":
            ratio_mask = datum.inputs.get("sequence_ratio_mask")
            mask = (ratio_mask != 0) if ratio_mask is not None else (adv != 0)
            mask = mask.astype(np.float64)
        plan.sequences.append(
            TrainSequence(
                datum.prompt, datum.response, loss_mask=mask.tolist(), advantages=adv.tolist(),
                old_logprobs=datum.inputs["logprobs"].astype(np.float64).tolist(),
            )  # fmt: skip
        )
    return plan


def loss_sum(plan: LossPlan, logprobs: list[list[float]]) -> float:
    """The loss's value at the learner's log-probs `logprobs` (a forward without backward)."""
    total = 0.0
    for seq, lp_list in zip(plan.sequences, logprobs, strict=True):
        lp, mask = np.asarray(lp_list, dtype=np.float64), np.asarray(seq.loss_mask, dtype=np.float64)
        if plan.loss == "cross_entropy":
            total += float(-(mask * lp).sum())
            continue
        adv, old = np.asarray(seq.advantages), np.asarray(seq.old_logprobs)
        if plan.loss == "gspo":
            ratio = np.exp(((lp - old) * mask).sum() / max(mask.sum(), 1.0)) * np.ones_like(lp)
        else:
            ratio = np.exp(lp - old)
        if plan.loss == "importance_sampling":
            total += float(-(ratio * adv * mask).sum())
            continue
        assert plan.clip_ratio_low is not None and plan.clip_ratio_high is not None
        clipped = np.clip(ratio, 1 - plan.clip_ratio_low, 1 + plan.clip_ratio_high)
        if plan.loss == "cispo":
            total += float(-(clipped * adv * lp * mask).sum())
        else:
            total += float((np.maximum(-adv * ratio, -adv * clipped) * mask).sum())
    return total
