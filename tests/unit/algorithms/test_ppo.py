"""PPO with a critic: GAE and the clipped value loss against values worked out by hand (padding,
masked rows, one-token responses included)."""

from __future__ import annotations

import math

import torch

from rlcore.core.algorithms import ALGORITHMS, trains_critic, with_preset
from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.ppo import ValueLoss, gae, gae_advantages, value_targets
from rlcore.core.algorithms.reinforce import reinforce_plus_plus_advantages
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.config.schema import AlgorithmConfig


def test_gae_by_hand() -> None:
    # one response of 3 tokens (reward 1 on the last), one of 1 token (reward -1), padded to 3
    rewards = torch.tensor([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.0, 0.0]])
    gamma, lam = 0.9, 0.8
    adv, returns = gae(rewards, values, gamma, lam)
    d2 = 1.0 - 0.4
    d1 = 0.0 + gamma * 0.4 - 0.2
    d0 = 0.0 + gamma * 0.2 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    want = torch.tensor([[a0, a1, a2], [-1.0 - 0.3, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(returns, want + values.double())


def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return() -> None:
    rewards = torch.tensor([[0.0, -0.1, 1.0]])
    adv, returns = gae(rewards, torch.zeros(1, 3), gamma=0.5, lam=1.0)
    torch.testing.assert_close(
        adv, torch.tensor([[0.5 * (-0.1) + 0.25, -0.1 + 0.5, 1.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(returns, adv)


def test_gae_advantages_are_whitened_over_trained_tokens_and_targets_are_unwhitened_returns() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2: filtered out
    values = torch.tensor([[0.5, 0.2, 0.4], [0.3, 9.0, 9.0], [7.0, 7.0, 7.0]])  # garbage past the ends
    cfg = AlgorithmConfig(algorithm_type="ppo", gamma=1.0, lam=1.0)
    batch = ScoredBatch(
        torch.tensor([1.0, -1.0, 5.0]), ["a", "b", "c"], response_mask=mask, values=values, cfg=cfg
    )
    # lam = gamma = 1: A_t = R - V_t with R the final reward; the critic's targets are R on every token
    raw = [1 - 0.5, 1 - 0.2, 1 - 0.4, -1 - 0.3]
    mean = sum(raw) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 3)
    want = torch.zeros(3, 3)
    want[0] = torch.tensor([(x - mean) / (std + 1e-6) for x in raw[:3]])
    want[1, 0] = (raw[3] - mean) / (std + 1e-6)
    torch.testing.assert_close(gae_advantages(batch), want)
    torch.testing.assert_close(
        value_targets(batch), torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0], [0.0] * 3])
    )


def test_gae_with_zero_values_matches_token_level_reinforce_plus_plus() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    cfg = AlgorithmConfig(algorithm_type="ppo", gamma=0.7, lam=1.0)
    batch = ScoredBatch(
        torch.tensor([1.0, 0.0]), ["a", "b"], response_mask=mask, values=torch.zeros(2, 3), cfg=cfg
    )
    torch.testing.assert_close(gae_advantages(batch), reinforce_plus_plus_advantages(batch))


def test_clipped_value_loss_by_hand() -> None:
    # token 0: moves 0.1 from 0 (inside the clip 0.2), target 1 -> (0.1 - 1)^2 on both sides
    # token 1: moves 0.5 from 0 (clipped to 0.2), target 1 -> max((0.5-1)^2, (0.2-1)^2) = 0.64, clipped
    # token 2: moves -0.5 from 0 (clipped to -0.2), target -1 -> max(0.25, 0.64) = 0.64, clipped
    # token 3: masked out
    values = torch.tensor([[0.1, 0.5, -0.5, 3.0]], requires_grad=True)
    batch = {
        "loss_mask": torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
        "values": torch.zeros(1, 4),
        "returns": torch.tensor([[1.0, 1.0, -1.0, 0.0]]),
    }
    loss_fn = ValueLoss(0.2, LossNorm(num_tokens=3.0, num_seqs=1.0, max_response_len=4))
    loss, metrics = loss_fn(values, None, batch)
    want = 0.5 * (0.81 + 0.64 + 0.64) / 3
    assert math.isclose(float(loss), want, rel_tol=1e-6)
    assert math.isclose(metrics["critic/vf_loss"], want, rel_tol=1e-6)
    assert math.isclose(metrics["critic/vf_clipfrac"], 2 / 3, rel_tol=1e-6)
    loss.backward()
    # the clipped side carries no gradient to the new value: only token 0 moves
    torch.testing.assert_close(values.grad, torch.tensor([[(0.1 - 1.0) / 3, 0.0, 0.0, 0.0]]))


def test_ppo_preset_trains_a_critic_with_gae_and_the_others_do_not() -> None:
    ppo = with_preset(AlgorithmConfig(algorithm_type="ppo"))
    assert (ppo.advantage_fn, ppo.policy_loss_fn, ppo.use_kl_in_reward) == ("gae", "ppo_clip", True)
    assert trains_critic(ppo)
    assert [name for name in ALGORITHMS if trains_critic(AlgorithmConfig(algorithm_type=name))] == ["ppo"]


def test_context_tokens_inside_a_response_are_passed_over() -> None:
    """A multi-turn response [model, model, env, env, model] gives the model's tokens the advantages
    and returns of the 3-token response [model, model, model] (gamma, lam < 1 make the step count
    visible); the context tokens get 0. So does token-level REINFORCE++."""
    cfg = AlgorithmConfig(algorithm_type="ppo", gamma=0.9, lam=0.8)
    turns = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.1, -0.2, 5.0, 5.0, 0.3]])  # the critic's values of context: ignored
    model = turns[0] > 0
    multi = ScoredBatch(torch.tensor([2.0]), ["a"], response_mask=turns, values=values, cfg=cfg)
    single = ScoredBatch(
        torch.tensor([2.0]), ["a"], response_mask=torch.ones(1, 3), values=values[:, model], cfg=cfg
    )
    for fn in (gae_advantages, value_targets, reinforce_plus_plus_advantages):
        got, want = fn(multi), fn(single)
        torch.testing.assert_close(got[:, model], want)
        assert got[0, 2:4].abs().max() == 0
    adv, ret = gae(torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0]]), values * turns, 0.9, 0.8, turns)
    raw, raw_ret = gae(torch.tensor([[0.0, 0.0, 2.0]]), values[:, model], 0.9, 0.8)
    torch.testing.assert_close(adv[:, model], raw)
    torch.testing.assert_close(ret[:, model], raw_ret)
