"""Tinker's losses as rlcore serves them (runtime/tinker/losses.py): gspo against Tinker's documented
formula, computed directly (torch autograd, as the documentation writes it) on a batch whose
advantages fall outside sequence_ratio_mask: the loss it reports, and the gradient the trainer's
surrogate (rlcore's own cispo loss with a zero clip range) gives; cross_entropy with the weights the
SDK's forward_backward_custom sends (any real numbers) through the same surrogate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'rlcore[tinker]'")
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402

from rlcore.core.algorithms.aggregation import LossNorm  # noqa: E402
from rlcore.core.algorithms.losses import PolicyLoss  # noqa: E402
from rlcore.core.config.schema import AlgorithmConfig  # noqa: E402
from rlcore.runtime.tinker.errors import UserError  # noqa: E402
from rlcore.runtime.tinker.losses import loss_sum, plan_loss, required_inputs, trainer_step  # noqa: E402
from rlcore.runtime.tinker.wire import decode_datums  # noqa: E402

LOW, HIGH = 0.8, 1.2
TOKENS = [5, 6, 7, 8, 9, 10]
SAMPLER = [-1.0, -2.0, -1.5, -0.5, -2.5, -1.0]
# (learner log-probs, advantages, sequence_ratio_mask or None), one datum each; M's mean log-ratio:
DATUMS = [
    (
        [-1.1, -1.8, -1.4, -0.6, -2.3, -0.7],
        [0.0, 0.7, -1.2, 0.4, 0.9, -0.5],
        [0, 0, 1, 1, 1, 0],
    ),  # 0.067: s inside
    (
        [-0.5, -1.2, -1.0, -0.1, -2.0, -2.0],
        [1.5, -0.8, 0.6, -0.3, 0.0, 2.0],
        [0, 1, 1, 1, 0, 0],
    ),  # 0.57: s > 1.2
    (
        [-1.6, -2.6, -1.9, -1.1, -2.8, -1.0],
        [0.0, 0.0, -0.4, 1.1, 0.0, 0.0],
        None,
    ),  # M = {A != 0}: -0.5: s < 0.8
]


def _tensor(values: list[float], dtype: int = pb.DTYPE_FLOAT32) -> pb.Tensor:
    return pb.Tensor(dense=np.asarray(values, "<f4" if dtype == pb.DTYPE_FLOAT32 else "<i8").tobytes(),
                     dtype=dtype, shape=[len(values)])  # fmt: skip


def _datum(advantages: list[float], mask: list[int] | None) -> pb.Datum:
    inputs = {"target_tokens": _tensor(TOKENS[1:] + [11], pb.DTYPE_INT64), "logprobs": _tensor(SAMPLER),
              "advantages": _tensor(advantages)}  # fmt: skip
    if mask is not None:
        inputs["sequence_ratio_mask"] = _tensor([float(m) for m in mask])
    chunk = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.asarray(TOKENS, "<i4").tobytes()))
    return pb.Datum(model_input=[chunk], loss_fn_inputs=inputs)


def _plan(datums: list[pb.Datum], loss_fn: str = "gspo"):
    request = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn=loss_fn, data=datums)
    decoded = decode_datums(request, required_inputs(loss_fn))
    config = {"clip_low_threshold": LOW, "clip_high_threshold": HIGH} if loss_fn == "gspo" else {}
    return plan_loss(loss_fn, config, decoded)


def _weighted(weights: list[float]) -> pb.Datum:
    inputs = {"target_tokens": _tensor(TOKENS[1:] + [11], pb.DTYPE_INT64), "weights": _tensor(weights)}
    chunk = pb.Chunk(encoded_text=pb.EncodedTextChunk(tokens=np.asarray(TOKENS, "<i4").tobytes()))
    return pb.Datum(model_input=[chunk], loss_fn_inputs=inputs)


def _trained_gradient(seq, lp: list[float], policy_loss_fn: str, clip: float | None) -> list[float]:
    """d loss / d lp of rlcore's own policy loss (or SFT's cross entropy) on one sequence, summed
    over tokens (token-mean over one token: Tinker's sums)."""
    algo = dataclasses.replace(AlgorithmConfig(algorithm_type="grpo"), policy_loss_fn=policy_loss_fn, kl_loss_fn="none",
                               clip_ratio_low=clip, clip_ratio_high=clip, loss_agg_mode="token-mean")  # fmt: skip
    batch = {k: torch.tensor([v], dtype=torch.float64) for k, v in
             (("loss_mask", seq.loss_mask), ("advantages", seq.advantages), ("old_logprobs", seq.old_logprobs))}  # fmt: skip
    target = torch.tensor([lp], dtype=torch.float64, requires_grad=True)
    loss, _ = PolicyLoss(algo, LossNorm(num_tokens=1.0, num_seqs=1.0, max_response_len=len(lp)))(target, None, batch)
    loss.backward()
    assert target.grad is not None
    return target.grad[0].tolist()


def documented_gspo(
    lp: list[float], q: list[float], adv: list[float], mask: list[int]
) -> tuple[float, list[float]]:
    """Tinker's GSPO (docs, losses/gspo) on one datum, in float64: the loss and d loss / d lp."""
    target = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    sampled, advantages = torch.tensor(q, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)
    in_ratio = torch.tensor(mask) != 0
    log_ratio = (target.detach() - sampled)[in_ratio].mean()
    ratio = torch.exp(log_ratio + target - target.detach())
    clipped = torch.clamp(ratio, LOW, HIGH)
    loss = -torch.min(ratio * advantages, clipped * advantages).sum()
    loss.backward()
    assert target.grad is not None
    return float(loss.detach()), target.grad.tolist()


def _f32(values: list[float]) -> list[float]:
    """The values as the wire carries them (float32)."""
    return np.asarray(values, np.float32).astype(np.float64).tolist()


def test_gspo_is_tinkers_documented_formula_where_advantages_fall_outside_the_ratio_mask() -> None:
    plan = _plan([_datum(adv, mask) for _, adv, mask in DATUMS])
    learner = [lp for lp, _, _ in DATUMS]
    masks = [mask or [int(a != 0) for a in adv] for _, adv, mask in DATUMS]
    want = [
        documented_gspo(lp, _f32(SAMPLER), _f32(adv), m)
        for (lp, adv, _), m in zip(DATUMS, masks, strict=True)
    ]
    # the value: every position's term, the ratio over M only
    assert loss_sum(plan, learner) == pytest.approx(sum(v for v, _ in want), rel=1e-12)
    inside = [
        documented_gspo(lp, _f32(SAMPLER), _f32([a * k for a, k in zip(adv, m, strict=True)]), m)[0]
        for (lp, adv, _), m in zip(DATUMS, masks, strict=True)
    ]
    assert abs(sum(inside) - sum(v for v, _ in want)) > 0.5  # a batch where the terms outside M matter

    # the gradient: the trainer's surrogate, rlcore's cispo loss at a zero clip range summed over tokens
    step = trainer_step(plan, learner)
    assert step is not None and (step.loss, step.clip_ratio_low, step.clip_ratio_high) == ("cispo", 0.0, 0.0)
    for seq, lp, (_, grad) in zip(step.sequences, learner, want, strict=True):
        assert _trained_gradient(seq, lp, "cispo", 0.0) == pytest.approx(grad, rel=1e-12, abs=1e-15)


def test_gspo_refuses_an_empty_ratio_mask_under_nonzero_advantages() -> None:
    with pytest.raises(UserError, match=r"data\[1\]\.loss_fn_inputs\.sequence_ratio_mask: marks no position"):
        _plan([_datum([0.0, 1.0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]), _datum([0.0, 1.0, 0, 0, 0, 0], [0] * 6)])
    plan = _plan([_datum([0.0] * 6, [0] * 6)])  # nothing to average, nothing it would weigh
    assert loss_sum(plan, [[-1.0] * 6]) == 0.0


def test_cross_entropy_trains_any_real_weights_as_forward_backward_custom_sends_them() -> None:
    """The SDK differentiates a custom loss C on the client and sends weights = -dC/dlp: the served
    loss is -sum(weights * lp) and the trained gradient dC/dlp, for weights outside [0, 1] too."""
    lp = [-1.1, -1.8, -1.4, -0.6, -2.3, -0.7]
    target = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    custom = -torch.nn.functional.logsigmoid(0.1 * (target[:3].sum() - target[3:].sum()))  # a DPO-like C
    custom.backward()
    assert target.grad is not None
    weights = _f32((-target.grad).tolist())  # negative on the rejected half, none in [0, 1] only
    assert min(weights) < 0
    plan = _plan([_weighted(weights)], "cross_entropy")
    assert loss_sum(plan, [lp]) == pytest.approx(-float(np.dot(weights, lp)), rel=1e-12)
    step = trainer_step(plan, [lp])
    assert step is not None and step.loss == "cispo"
    assert _trained_gradient(step.sequences[0], lp, "cispo", 0.0) == pytest.approx([-w for w in weights], rel=1e-12)

    # weights in [0, 1] stay rlcore's cross entropy, the loss mask the weights
    plain = _plan([_weighted([0.0, 0.5, 1.0, 1.0, 0.25, 0.0])], "cross_entropy")
    assert plain.loss == "cross_entropy" and plain.sequences[0].loss_mask == [0.0, 0.5, 1.0, 1.0, 0.25, 0.0]
