"""Rollout correction: truncated and masked importance weights of the engine's log-probs against the
trainer's, at token, sequence and geometric-mean level, against values worked out by hand; the
policy loss multiplied by them; the mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.correction import IS_WEIGHT, MismatchStats, correction_weights
from rlcore.core.algorithms.losses import PolicyLoss
from rlcore.core.config.schema import AlgorithmConfig, RolloutCorrectionConfig

# two responses; the second has 2 trained tokens. token ratios r = pi_old / pi_engine:
R = [[3.0, 0.6, 1.2], [1.5, 0.25, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ENGINE = torch.full((2, 3), -2.0)
OLD = ENGINE + torch.tensor(R).log() * MASK


def weights(kind: str, level: str, high: float = 2.0, low: float | None = None) -> list[float]:
    """The weights, row after row."""
    w, _ = correction_weights(
        OLD, ENGINE, MASK, RolloutCorrectionConfig(kind=kind, level=level, high=high, low=low)
    )
    return w.flatten().tolist()


def test_token_tis_truncates_each_ratio_at_the_threshold() -> None:
    assert weights("tis", "token") == pytest.approx([2.0, 0.6, 1.2, 1.5, 0.25, 0.0])


def test_token_mis_masks_ratios_outside_both_bounds() -> None:
    # [1/2, 2]: 3.0 and 0.25 are rejected (weight 0: they leave the loss); with low 0.2, 0.25 stays
    assert weights("mis", "token") == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert weights("mis", "token", low=0.2) == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]


def test_sequence_weights_take_the_product_or_the_geometric_mean_of_the_token_ratios() -> None:
    # response 0: product 3 * 0.6 * 1.2 = 2.16, geometric 2.16^(1/3); response 1: 1.5 * 0.25 = 0.375, sqrt
    assert weights("tis", "sequence") == pytest.approx([2.0] * 3 + [0.375, 0.375, 0.0])
    assert weights("tis", "sequence", high=1.5) == pytest.approx([1.5] * 3 + [0.375, 0.375, 0.0])
    g0, g1 = 2.16 ** (1 / 3), math.sqrt(0.375)
    assert weights("tis", "geometric") == pytest.approx([g0] * 3 + [g1, g1, 0.0])
    # mis in [1/2.5, 2.5]: response 1's product 0.375 leaves the loss; in [1/2, 2] its geometric
    # mean 0.61 stays, and so does response 0's 1.29
    assert weights("mis", "sequence", high=2.5) == [1.0] * 3 + [0.0] * 3
    assert weights("mis", "geometric") == [1.0] * 3 + [1.0, 1.0, 0.0]


def test_the_policy_loss_weighs_each_tokens_term() -> None:
    """ppo_clip at ratio 1 (pi = pi_old) is -A per token: with weights, -A w, averaged over tokens."""
    cfg = AlgorithmConfig(algorithm_type="grpo", kl_loss_coef=0.0)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    w = torch.tensor([[2.0, 0.5, 1.2], [1.5, 0.25, 0.0]])
    batch = {"loss_mask": MASK, "advantages": adv, "old_logprobs": OLD, IS_WEIGHT: w}
    loss, _ = PolicyLoss(cfg, LossNorm.local(MASK, 3))(OLD.clone(), None, batch)
    want = -(2.0 + 0.5 + 1.2 - 2 * 1.5 - 2 * 0.25) / 5
    assert float(loss) == pytest.approx(want)
    del batch[IS_WEIGHT]
    assert float(PolicyLoss(cfg, LossNorm.local(MASK, 3))(OLD.clone(), None, batch)[0]) == pytest.approx(
        -(3 - 4) / 5
    )


def test_mismatch_metrics_over_the_trained_tokens() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        stats = MismatchStats()
        _, changed = correction_weights(OLD, ENGINE, MASK, RolloutCorrectionConfig(kind="tis"))
        stats.add(OLD, ENGINE, MASK, changed)
        got = stats.metrics(None, "tis")
    finally:
        dist.destroy_process_group()
    ratios = [3.0, 0.6, 1.2, 1.5, 0.25]
    k3 = sum(r - 1 - math.log(r) for r in ratios) / 5
    assert got["rollout_correction/k3_kl"] == pytest.approx(k3, rel=1e-5)
    assert got["rollout_correction/ratio_p50"] == pytest.approx(1.2, rel=1e-5)
    assert got["rollout_correction/tokens_truncated"] == pytest.approx(1 / 5)  # only 3.0 > 2
    assert got["rollout_correction/seqs_truncated"] == pytest.approx(1 / 2)
