"""mix: the expert-row count and the mixed loss against values worked out by hand."""

from __future__ import annotations

import pytest
import torch

from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.losses import PolicyLoss, SFTLoss
from rlcore.core.algorithms.mix import EXPERT, MixLoss, expert_rows_per_step
from rlcore.core.config.schema import AlgorithmConfig


def test_expert_rows_make_the_configured_share_of_the_train_batch() -> None:
    assert expert_rows_per_step(128, 0.5) == 128
    assert expert_rows_per_step(128, 0.2) == 32  # 32 / (128 + 32) = 0.2
    assert expert_rows_per_step(10, 0.25) == 4  # ceil(3.33)
    assert expert_rows_per_step(128, 0.0) == 0


def test_mixed_loss_weighs_the_policy_loss_and_the_expert_nll() -> None:
    cfg = AlgorithmConfig(algorithm_type="mix", kl_loss_coef=0.0)
    # rollouts: 3 tokens (one masked), on-policy ratio 1 -> per token -A; token-mean over 2 tokens
    policy = PolicyLoss(cfg, LossNorm(num_tokens=2.0, num_seqs=1.0, max_response_len=3))
    rollout = {
        "loss_mask": torch.tensor([[1.0, 1.0, 0.0]]),
        "advantages": torch.tensor([[0.5, 0.5, 0.0]]),
        "old_logprobs": torch.tensor([[-1.0, -2.0, -3.0]]),
    }
    # experts: NLL token-mean over their 4 tokens
    expert = {"loss_mask": torch.tensor([[1.0, 1.0, 1.0, 1.0]]), EXPERT: torch.ones(1, 4)}
    mix = MixLoss(policy, SFTLoss(LossNorm(num_tokens=4.0, num_seqs=1.0, max_response_len=4)), mu=0.25)
    loss, metrics = mix(torch.tensor([[-1.0, -2.0, -3.0]]), None, rollout)
    assert float(loss) == pytest.approx(0.75 * -0.5)
    assert metrics["actor/pg_loss"] == pytest.approx(-0.5)
    loss, metrics = mix(torch.tensor([[-1.0, -1.0, -2.0, -4.0]]), None, expert)
    assert float(loss) == pytest.approx(0.25 * 2.0)
    assert metrics == {"mix/expert_nll": pytest.approx(2.0)}
