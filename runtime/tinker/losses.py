"""Tinker's loss functions as rlcore's trainer losses (TrainerService.ForwardBackward).

Tinker sums every loss over tokens and datums; rlcore's trainer normalises by the token count it
is given, so every request goes with normalize_tokens 1. Per loss (lp: the learner's log-prob of a
target, slp: the sampler's, `logprobs` in loss_fn_inputs; r = exp(lp - slp)):

    cross_entropy        -sum(weights * lp)                     rlcore cross_entropy, loss_mask = weights
                                                                (weights outside [0, 1]: the linear surrogate)
    importance_sampling  -sum(r * advantages)                   rlcore importance_sampling
    ppo                  -sum(min(r A, clip(r, lo, hi) A))      rlcore ppo, clip 1 - lo, hi - 1
    cispo                -sum(sg(clip(r, lo, hi)) * lp * A)     rlcore cispo, clip 1 - lo, hi - 1
    gspo                 -sum_t min(s_t A_t, clip(s_t, lo, hi) A_t), s_t = sg(s) * exp(lp_t - sg(lp_t)),
                         s = exp(mean over M of lp - slp)       (Tinker's GSPO-token, as documented)

gspo's sequence ratio s averages over the positions M of sequence_ratio_mask (without one: those
with a nonzero advantage; a datum whose M is empty while an advantage is not is refused: the mean
would be over nothing), and the sum runs over every position, M or not. rlcore's own gspo takes its
ratio and its loss over one mask, so the trainer trains gspo's gradient instead, as Tinker's
forward_backward_custom does: the learner's log-probs of a forward (the ones the response returns),
g = dL/dlp from the formula on them, then -sum(-g * lp), rlcore's cispo with a zero clip range
(its weight clip(r, 1, 1) = 1), whose gradient is sum(g * grad lp); the loss reported is the formula's.

cross_entropy's weights may be any real numbers: the SDK's forward_backward_custom sends
weights = -dC/dlp of the user's loss C on a forward's log-probs. rlcore's loss mask is a mask (a
weight in [0, 1] that also counts tokens), so weights outside it train the same linear surrogate
gspo does, rlcore's cispo with a zero clip range and advantages = weights (old log-probs 0: the
weight clip(r, 1, 1) is 1 whatever r), whose value and gradient are cross_entropy's.

lo and hi are loss_fn_config's clip_low_threshold and clip_high_threshold (0.8 and 1.2 unless
given). Policy losses train every position (a zero advantage adds nothing). dro, stable_reinforce
and custom are not served: a UserError names them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

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
    ratio_masks: list[np.ndarray] = field(default_factory=list)
    """gspo: per datum, the positions its sequence ratio averages over (M)."""


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
        weights = [datum.inputs["weights"].astype(np.float64) for datum in datums]
        if all(w.size == 0 or (w.min() >= 0 and w.max() <= 1) for w in weights):
            seqs = [
                TrainSequence(datum.prompt, datum.response, loss_mask=w.tolist())
                for datum, w in zip(datums, weights, strict=True)
            ]
            return LossPlan("cross_entropy", seqs)
        return _weighted_surrogate(datums, weights)
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
    for d, datum in enumerate(datums):
        adv = datum.inputs["advantages"].astype(np.float64)
        if loss_fn == "gspo":
            given = datum.inputs.get("sequence_ratio_mask")
            in_ratio = (given != 0) if given is not None else (adv != 0)
            if not in_ratio.any() and adv.any():
                raise UserError(f"data[{d}].loss_fn_inputs.sequence_ratio_mask: marks no position while advantages "
                                "are nonzero: the sequence ratio would average over nothing")  # fmt: skip
            plan.ratio_masks.append(in_ratio)
        plan.sequences.append(
            TrainSequence(
                datum.prompt,
                datum.response,
                loss_mask=[1.0] * len(adv),
                advantages=adv.tolist(),
                old_logprobs=datum.inputs["logprobs"].astype(np.float64).tolist(),
            )
        )
    return plan


def _weighted_surrogate(datums: list[Datum], weights: list[np.ndarray]) -> LossPlan:
    """cross_entropy with weights outside [0, 1] as rlcore's cispo with a zero clip range: loss
    -sum(1 * w * lp) over the positions whose weight is not 0 (the module's docstring)."""
    seqs = [
        TrainSequence(
            datum.prompt, datum.response, loss_mask=(w != 0).astype(np.float64).tolist(),
            advantages=w.tolist(), old_logprobs=[0.0] * len(w),
        )  # fmt: skip
        for datum, w in zip(datums, weights, strict=True)
    ]
    return LossPlan("cispo", seqs, clip_ratio_low=0.0, clip_ratio_high=0.0)


def gspo_loss(
    lp: np.ndarray, slp: np.ndarray, adv: np.ndarray, in_ratio: np.ndarray, low: float, high: float
) -> tuple[float, np.ndarray]:
    """Tinker's GSPO loss of one datum and its gradient with respect to the learner's log-probs `lp`.
    Every position carries the sequence ratio s (over `in_ratio`) and its own log-prob's gradient, so
    d/dlp_t of -min(s_t A_t, clip(s_t, low, high) A_t) is -A_t s where the unclipped term is the min
    or the clip lets it through (low <= s <= high: there torch's min and clamp pass it), else 0."""
    s = float(np.exp((lp - slp)[in_ratio].mean())) if in_ratio.any() else 1.0  # no M: every A_t is 0
    value = float(np.maximum(-adv * s, -adv * min(max(s, low), high)).sum())
    if low <= s <= high:
        live = np.ones_like(adv, dtype=bool)
    else:  # the clip binds where it would push the advantage's way
        live = adv < 0 if s > high else adv > 0
    return value, np.where(live, -adv * s, 0.0)


def _gspo_each(plan: LossPlan, logprobs: list[list[float]]) -> list[tuple[float, np.ndarray]]:
    """gspo_loss of every datum of a gspo plan at the learner's log-probs `logprobs`."""
    assert plan.clip_ratio_low is not None and plan.clip_ratio_high is not None
    low, high = 1 - plan.clip_ratio_low, 1 + plan.clip_ratio_high  # Tinker's thresholds
    return [
        gspo_loss(
            np.asarray(lp), np.asarray(seq.old_logprobs), np.asarray(seq.advantages), in_ratio, low, high
        )
        for seq, lp, in_ratio in zip(plan.sequences, logprobs, plan.ratio_masks, strict=True)
    ]


def trainer_step(plan: LossPlan, logprobs: list[list[float]]) -> LossPlan | None:
    """What rlcore's trainer trains for `plan`, given the learner's log-probs of its targets: the plan
    itself, gspo's linear surrogate (its gradient: cispo with a zero clip range), or None when
    nothing trains (no weight)."""
    if not any(max(s.loss_mask) > 0 for s in plan.sequences):
        return None
    if plan.loss != "gspo":
        return plan
    seqs = [
        dataclasses.replace(seq, advantages=(-grad).tolist(), old_logprobs=list(lp))
        for seq, lp, (_, grad) in zip(plan.sequences, logprobs, _gspo_each(plan, logprobs), strict=True)
    ]
    return LossPlan("cispo", seqs, clip_ratio_low=0.0, clip_ratio_high=0.0)


def loss_sum(plan: LossPlan, logprobs: list[list[float]]) -> float:
    """The loss's value at the learner's log-probs `logprobs` (a forward without backward)."""
    if plan.loss == "gspo":
        return sum(value for value, _ in _gspo_each(plan, logprobs))
    total = 0.0
    for seq, lp_list in zip(plan.sequences, logprobs, strict=True):
        lp, mask = np.asarray(lp_list, dtype=np.float64), np.asarray(seq.loss_mask, dtype=np.float64)
        if plan.loss == "cross_entropy":
            total += float(-(mask * lp).sum())
            continue
        adv, old = np.asarray(seq.advantages), np.asarray(seq.old_logprobs)
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
