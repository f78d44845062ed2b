import pytest
import torch

from rlcore.core.algorithms.grpo import grpo_advantages
from rlcore.core.algorithms.scored import ScoredBatch

# Groups interleaved on purpose: a = [1, 2, 3], b = [0, 4], c = [5].
IDS = ["a", "b", "a", "c", "b", "a"]
REWARDS = torch.tensor([1.0, 0.0, 2.0, 5.0, 4.0, 3.0])


def test_grpo_std_normalized():
    # a: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1        -> [-1, 0, 1] / (1 + 1e-6)
    # b: mean 2, unbiased std sqrt((4 + 4) / 1) = 2.8284271    -> [-2, 2] / 2.8284281 = -+0.7071065
    # c: a group of one -> 0
    adv = grpo_advantages(ScoredBatch(REWARDS, IDS))
    a = 1 / (1 + 1e-6)
    b = 2 / (8**0.5 + 1e-6)
    expected = torch.tensor([-a, -b, 0.0, 0.0, b, a])
    torch.testing.assert_close(adv, expected)
    assert adv.dtype == torch.float32


def test_grpo_without_std():
    # a: [1, 2, 3] - 2; b: [0, 4] - 2; c: 5 - 5
    adv = grpo_advantages(ScoredBatch(REWARDS, IDS), std_normalize=False)
    torch.testing.assert_close(adv, torch.tensor([-1.0, -2.0, 0.0, 0.0, 2.0, 1.0]))


def test_grpo_singleton_and_constant_groups_are_zero():
    # a group of one has no baseline; a group with equal rewards has std 0 and r - mean = 0
    adv = grpo_advantages(ScoredBatch(torch.tensor([7.0, 1.0, 1.0, 1.0]), ["s", "k", "k", "k"]))
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_grpo_eps():
    # [0, 1]: mean 0.5, std sqrt(0.5) = 0.70710678; eps = 0.29289322 makes the divisor exactly 1
    adv = grpo_advantages(ScoredBatch(torch.tensor([0.0, 1.0]), ["g", "g"]), eps=1 - 0.5**0.5)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5]))


def test_grpo_needs_one_id_per_reward():
    with pytest.raises(AssertionError):
        ScoredBatch(torch.tensor([1.0, 2.0]), ["a"])
