import math

import pytest
import torch

from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.losses import PolicyLoss, SFTLoss, build_loss
from rlcore.core.config.schema import AlgorithmConfig


def _cfg(**overrides) -> AlgorithmConfig:
    base = dict(
        kl_loss_fn="none", kl_loss_coef=0.0, entropy_coef=0.0, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    return AlgorithmConfig(**(base | overrides))


def _batch(ratios: list[float], advantages: list[float], mask: list[float] | None = None):
    """One sequence whose tokens have the given ratios exp(lp - old) and advantages; old = -1."""
    old = torch.full((1, len(ratios)), -1.0)
    lp = (old + torch.log(torch.tensor([ratios]))).requires_grad_()
    mask_t = torch.tensor([mask if mask is not None else [1.0] * len(ratios)])
    batch = {"old_logprobs": old, "advantages": torch.tensor([advantages]), "loss_mask": mask_t}
    return lp, batch, LossNorm.local(mask_t, max_response_len=len(ratios))


def test_ratio_inside_clip_range():
    # ratio 1.1, A = 2: max(-2 * 1.1, -2 * 1.1) = -2.2; d/dlp (-A * ratio) = -A * ratio = -2.2
    lp, batch, norm = _batch([1.1], [2.0])
    loss, metrics = PolicyLoss(_cfg(), norm)(lp, None, batch)
    loss.backward()
    assert loss.item() == pytest.approx(-2.2)
    assert lp.grad.item() == pytest.approx(-2.2)
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(1.1))  # old - lp


def test_ratio_above_high_with_positive_advantage_is_clipped():
    # ratio 1.5 > 1.2, A = 1: max(-1.5, -1.2) = -1.2, a constant: no gradient
    lp, batch, norm = _batch([1.5], [1.0])
    loss, metrics = PolicyLoss(_cfg(), norm)(lp, None, batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2)
    assert lp.grad.item() == 0.0
    assert metrics["actor/pg_clipfrac"] == 1.0


def test_ratio_below_low_with_negative_advantage_is_clipped():
    # ratio 0.5 < 0.8, A = -1: max(0.5, 0.8) = 0.8, constant: no gradient
    lp, batch, norm = _batch([0.5], [-1.0])
    loss, metrics = PolicyLoss(_cfg(), norm)(lp, None, batch)
    loss.backward()
    assert loss.item() == pytest.approx(0.8)
    assert lp.grad.item() == 0.0
    assert metrics["actor/pg_clipfrac"] == 1.0


def test_outside_range_but_pessimistic_side_is_not_clipped():
    # ratio 1.5, A = -1: max(1.5, 1.2) = 1.5, grad -A * ratio = 1.5
    # ratio 0.5, A = +1: max(-0.5, -0.8) = -0.5, grad -A * ratio = -0.5
    # token-mean over 2 tokens: loss (1.5 - 0.5) / 2 = 0.5, grads halved
    lp, batch, norm = _batch([1.5, 0.5], [-1.0, 1.0])
    loss, metrics = PolicyLoss(_cfg(), norm)(lp, None, batch)
    loss.backward()
    assert loss.item() == pytest.approx(0.5)
    torch.testing.assert_close(lp.grad, torch.tensor([[0.75, -0.25]]))
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_separate_low_and_high_clip():
    # clip range [1 - 0.1, 1 + 0.3] = [0.9, 1.3]; a 5th, masked token with a wild ratio must not count
    #   ratio 1.25, A = +1: inside      -> -1.25, grad -1.25
    #   ratio 1.35, A = +1: above 1.3   -> -1.3 (clipped), grad 0
    #   ratio 0.85, A = -1: below 0.9   ->  0.9 (clipped), grad 0
    #   ratio 0.95, A = -1: inside      ->  0.95, grad 0.95
    # token-mean: (-1.25 - 1.3 + 0.9 + 0.95) / 4 = -0.175; clipfrac 2 / 4
    # (symmetric 0.2 would give (-1.2 - 1.2 + 0.85 + 0.95) / 4 = -0.15)
    lp, batch, norm = _batch([1.25, 1.35, 0.85, 0.95, 50.0], [1.0, 1.0, -1.0, -1.0, -3.0], [1, 1, 1, 1, 0])
    loss, metrics = PolicyLoss(_cfg(clip_ratio_low=0.1, clip_ratio_high=0.3), norm)(lp, None, batch)
    loss.backward()
    assert loss.item() == pytest.approx(-0.175)
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.25 / 4, 0.0, 0.0, 0.95 / 4, 0.0]]))
    assert metrics["actor/pg_clipfrac"] == 0.5
    assert metrics["actor/pg_loss"] == metrics["actor/loss"] == pytest.approx(-0.175)
    symmetric, _ = PolicyLoss(_cfg(), norm)(lp, None, batch)
    assert symmetric.item() == pytest.approx(-0.15)


def test_kl_loss_and_entropy_terms():
    # ratio 1, A = 1 -> pg -1; ref = lp - 0.4 -> k1 = 0.4; entropy 2.0
    # loss = -1 + 0.5 * 0.4 - 0.05 * 2.0 = -0.9; d loss / d entropy = -0.05
    lp, batch, norm = _batch([1.0], [1.0])
    batch["ref_logprobs"] = lp.detach() - 0.4
    entropy = torch.tensor([[2.0]], requires_grad=True)
    loss_fn = PolicyLoss(_cfg(kl_loss_fn="k1", kl_loss_coef=0.5, entropy_coef=0.05), norm)
    assert loss_fn.needs_reference and loss_fn.needs_entropy
    loss, metrics = loss_fn(lp, entropy, batch)
    loss.backward()
    assert loss.item() == pytest.approx(-0.9)
    # d/dlp: pg -A * ratio = -1, kl 0.5 * d(lp - ref)/dlp = 0.5
    assert lp.grad.item() == pytest.approx(-0.5)
    assert entropy.grad.item() == pytest.approx(-0.05)
    assert metrics == pytest.approx(
        {
            "actor/pg_loss": -1.0,
            "actor/pg_clipfrac": 0.0,
            "actor/ppo_kl": 0.0,
            "actor/kl_loss": 0.4,
            "actor/entropy": 2.0,
            "actor/loss": -0.9,
        }
    )


def test_entropy_reported_but_not_used_when_coef_is_zero():
    lp, batch, norm = _batch([1.0], [1.0])
    loss_fn = PolicyLoss(_cfg(), norm)
    assert not loss_fn.needs_entropy and not loss_fn.needs_reference
    loss, metrics = loss_fn(lp, torch.tensor([[3.0]]), batch)
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["actor/entropy"] == 3.0
    assert "actor/kl_loss" not in metrics


def test_needs_reference():
    norm = LossNorm(1.0, 1.0, 1)
    assert PolicyLoss(AlgorithmConfig(), norm).needs_reference  # defaults: k3 with coef 0.001
    assert not PolicyLoss(_cfg(kl_loss_fn="k3", kl_loss_coef=0.0), norm).needs_reference
    assert not PolicyLoss(_cfg(kl_loss_fn="none", kl_loss_coef=0.1), norm).needs_reference
    lp, batch, norm = _batch([1.0], [1.0])
    with pytest.raises(KeyError, match="ref_logprobs"):
        PolicyLoss(AlgorithmConfig(), norm)(lp, None, batch)


def test_micro_batches_sum_to_whole_batch():
    # seq-mean-token-mean with k3 and entropy: every term and metric must add up over micro-batches
    torch.manual_seed(0)
    B, T = 4, 6
    mask = (torch.arange(T) < torch.tensor([6, 2, 4, 1])[:, None]).float()
    batch = {
        "old_logprobs": -torch.rand(B, T),
        "ref_logprobs": -torch.rand(B, T),
        "advantages": torch.randn(B, 1).expand(B, T) * mask,
        "loss_mask": mask,
    }
    lp, entropy = -torch.rand(B, T), torch.rand(B, T)
    cfg = _cfg(kl_loss_fn="k3", kl_loss_coef=0.1, entropy_coef=0.01, loss_agg_mode="seq-mean-token-mean")
    loss_fn = PolicyLoss(cfg, LossNorm.local(mask, max_response_len=T))
    whole, whole_metrics = loss_fn(lp, entropy, batch)
    parts = [
        loss_fn(lp[s], entropy[s], {k: v[s] for k, v in batch.items()}) for s in (slice(0, 1), slice(1, 4))
    ]
    torch.testing.assert_close(parts[0][0] + parts[1][0], whole)
    for key, value in whole_metrics.items():
        assert parts[0][1][key] + parts[1][1][key] == pytest.approx(value, abs=1e-6), key


def test_sft_loss_is_mean_nll():
    # NLL of the 3 response tokens: (1 + 2 + 0.5) / 3 = 1.1666667
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss_fn = SFTLoss(LossNorm.local(mask, max_response_len=3))
    assert not loss_fn.needs_entropy and not loss_fn.needs_reference
    loss, metrics = loss_fn(lp, None, {"loss_mask": mask})
    loss.backward()
    assert loss.item() == pytest.approx(3.5 / 3)
    assert metrics == {"sft/loss": pytest.approx(3.5 / 3)}
    torch.testing.assert_close(lp.grad, -mask / 3)


def test_build_loss():
    norm = LossNorm(1.0, 1.0, 1)
    sft = build_loss(AlgorithmConfig(algorithm_type="sft", loss_agg_mode="seq-mean-token-sum"), norm)
    assert isinstance(sft, SFTLoss) and sft.loss_agg_mode == "seq-mean-token-sum"
    assert isinstance(build_loss(AlgorithmConfig(algorithm_type="grpo"), norm), PolicyLoss)
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        SFTLoss(norm, "mean")
