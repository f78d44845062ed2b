"""Token-level REINFORCE++, OPMD, MaxEnt-GRPO, dual-clip PPO and DAPO's shaping against values
worked out by hand: groups of one, all-equal rewards, masked and truncated responses included."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.core.algorithms import with_preset
from rlcore.core.algorithms.dapo import informative_groups, overlong_penalty, truncated
from rlcore.core.algorithms.losses import ppo_clip_terms
from rlcore.core.algorithms.maxent import maxent_advantages, weighted_likelihood_terms
from rlcore.core.algorithms.opmd import opmd_advantages, opmd_terms
from rlcore.core.algorithms.reinforce import reinforce_plus_plus_advantages
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.config.schema import AlgorithmConfig, MaxEntConfig, OpmdConfig


def test_token_rewards_put_the_score_on_the_last_trained_token_and_the_penalty_on_every_token() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2: filtered out
    penalty = torch.full((3, 3), 0.1)
    batch = ScoredBatch(torch.tensor([0.7, 0.3, 5.0]), ["a", "a", "b"], scores=torch.tensor([1.0, 0.5, 5.0]),
                        response_mask=mask, token_penalty=penalty)  # fmt: skip
    expected = [[-0.1, -0.1, 0.9], [0.4, 0.0, 0.0], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(batch.token_rewards(), torch.tensor(expected))


def test_reinforce_plus_plus_whitens_discounted_returns_over_trained_tokens() -> None:
    # row 0: rewards (0, 0, 1) with gamma 0.5 -> returns 0.25, 0.5, 1; row 1: reward -1 on its one token
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    cfg = AlgorithmConfig(gamma=0.5)
    adv = reinforce_plus_plus_advantages(
        ScoredBatch(torch.tensor([1.0, -1.0]), ["a", "b"], response_mask=mask, cfg=cfg)
    )
    returns = [0.25, 0.5, 1.0, -1.0]
    mean = sum(returns) / 4
    std = math.sqrt(sum((g - mean) ** 2 for g in returns) / 3)
    want = [(g - mean) / (std + 1e-6) for g in returns]
    assert adv[0].tolist() == pytest.approx(want[:3], rel=1e-5)
    assert adv[1].tolist() == pytest.approx([want[3], 0.0, 0.0], rel=1e-5)  # padding stays 0
    # a single trained token has nothing to normalise against
    one = ScoredBatch(torch.tensor([1.0]), ["a"], response_mask=torch.tensor([[1.0, 0.0]]), cfg=cfg)
    assert reinforce_plus_plus_advantages(one).tolist() == [[0.0, 0.0]]


def test_reinforce_plus_plus_preset_puts_the_kl_in_the_reward() -> None:
    cfg = with_preset(AlgorithmConfig(algorithm_type="reinforce_plus_plus"))
    assert (cfg.advantage_fn, cfg.use_kl_in_reward) == ("reinforce_plus_plus", True)
    assert with_preset(AlgorithmConfig(algorithm_type="grpo")).use_kl_in_reward is False


GROUPS = ["a", "a", "a", "b", "b", "c"]
REWARDS = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.7])


def test_opmd_mean_baseline_and_logavgexp_baseline() -> None:
    mean = opmd_advantages(ScoredBatch(REWARDS, GROUPS, cfg=AlgorithmConfig(opmd=OpmdConfig(baseline="mean"))))
    assert mean.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    tau = 0.5
    cfg = AlgorithmConfig(opmd=OpmdConfig(baseline="logavgexp", tau=tau))
    got = opmd_advantages(ScoredBatch(REWARDS, GROUPS, cfg=cfg)).tolist()
    b_a = tau * math.log((math.exp(2.0) + math.exp(0.0) + math.exp(1.0)) / 3)
    # group b: all equal -> b = r exactly -> 0; group c of one -> 0
    assert got == pytest.approx([1.0 - b_a, -b_a, 0.5 - b_a, 0.0, 0.0, 0.0], abs=1e-6)


def test_opmd_loss_is_reinforce_scaled_by_one_over_one_plus_tau() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[0.5, 0.5]])
    loss, clipped = opmd_terms(
        logprobs, torch.zeros(1, 2) + 7.0, adv, torch.ones(1, 2), AlgorithmConfig(opmd=OpmdConfig(tau=3.0))
    )
    torch.testing.assert_close(
        loss, torch.tensor([[0.125, 0.25]])
    )  # -0.5 * lp / 4; old log-probs play no part
    assert clipped.sum() == 0
    loss.sum().backward()
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.125, -0.125]]))


def test_maxent_weights_without_the_reference() -> None:
    # beta = 0: w = softmax(log q / tau) = q^(1/tau) normalised, q = softmax(r / T) (epsilon 0)
    cfg = AlgorithmConfig(maxent_grpo=MaxEntConfig(tau=0.5, q_temperature=1.0, q_epsilon=0.0), kl_loss_coef=0.0)
    adv = maxent_advantages(ScoredBatch(REWARDS, GROUPS, cfg=cfg)).tolist()
    q = [math.exp(r) for r in (1.0, 0.0, 0.5)]
    w = [x**2 / sum(y**2 for y in q) for x in q]  # 1/tau = 2
    # group a: K w_i; b: all equal, c: one response -> left out (0)
    assert adv == pytest.approx([3 * w[0], 3 * w[1], 3 * w[2], 0.0, 0.0, 0.0], rel=1e-6)


def test_maxent_weights_blend_the_reference_by_beta() -> None:
    # two responses, rewards 1 and 0, T = 1, eps = 0; reference mean log-probs -1 (2 tokens) and -3 (1 token)
    tau, beta = 0.3, 0.2
    cfg = AlgorithmConfig(maxent_grpo=MaxEntConfig(tau=tau, q_temperature=1.0, q_epsilon=0.0), kl_loss_coef=beta)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ref = torch.tensor([[-0.5, -1.5], [-3.0, 9.0]])  # the 9.0 is padding
    batch = ScoredBatch(torch.tensor([1.0, 0.0]), ["g", "g"], response_mask=mask, ref_logprobs=ref, cfg=cfg)
    q = [math.e / (math.e + 1), 1 / (math.e + 1)]
    logits = [(math.log(q[0]) + beta * -1.0) / (tau + beta), (math.log(q[1]) + beta * -3.0) / (tau + beta)]
    w0 = math.exp(logits[0]) / (math.exp(logits[0]) + math.exp(logits[1]))
    assert maxent_advantages(batch).tolist() == pytest.approx([2 * w0, 2 * (1 - w0)], rel=1e-6)
    # the sum of log-probs instead of their mean
    cfg.maxent_grpo.length_normalize_ref = False
    logits = [(math.log(q[0]) + beta * -2.0) / (tau + beta), (math.log(q[1]) + beta * -3.0) / (tau + beta)]
    w0 = math.exp(logits[0]) / (math.exp(logits[0]) + math.exp(logits[1]))
    assert maxent_advantages(batch).tolist() == pytest.approx([2 * w0, 2 * (1 - w0)], rel=1e-6)


def test_weighted_likelihood_is_the_weighted_log_likelihood() -> None:
    loss, _ = weighted_likelihood_terms(torch.tensor([[-1.0, -2.0]]), torch.zeros(1, 2), torch.tensor([[1.5, 1.5]]),
                                        torch.ones(1, 2), AlgorithmConfig())  # fmt: skip
    assert loss.tolist() == [[1.5, 3.0]]


def test_dual_clip_caps_the_loss_of_negative_advantages() -> None:
    cfg = with_preset(AlgorithmConfig(clip_ratio_c=3.0))
    old = torch.zeros(1, 3)
    logprobs = torch.log(torch.tensor([[5.0, 5.0, 2.0]]))  # ratios 5, 5, 2
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    loss, clipped = ppo_clip_terms(logprobs, old, adv, torch.ones(1, 3), cfg)
    # A<0, r=5: PPO's loss is max(5, 1.2) = 5, capped at 3; A>0, r=5: -1.2 (clipped, no cap); A<0, r=2: 2 < 3
    torch.testing.assert_close(loss, torch.tensor([[3.0, -1.2, 2.0]]))
    assert clipped.tolist() == [[1.0, 1.0, 0.0]]
    plain, _ = ppo_clip_terms(logprobs, old, adv, torch.ones(1, 3), with_preset(AlgorithmConfig()))
    assert plain[0, 0].item() == pytest.approx(5.0)


def test_dapo_preset_and_shaping() -> None:
    cfg = with_preset(AlgorithmConfig(algorithm_type="dapo"))
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert cfg.overlong_filter and cfg.dynamic_sampling
    assert informative_groups([1.0, 0.0, 1.0, 1.0, 0.3], ["a", "a", "b", "b", "c"]) == ["a"]
    assert truncated("length") and not truncated("stop")
    # budget 10, buffer 4: no penalty up to 6 tokens, then a quarter per token, all of it at 10 and past
    assert [overlong_penalty(n, 10, 4, 1.0) for n in (5, 6, 7, 9, 10, 12)] == [
        0.0,
        0.0,
        -0.25,
        -0.75,
        -1.0,
        -1.0,
    ]
    assert overlong_penalty(12, 10, 0, 1.0) == 0.0
