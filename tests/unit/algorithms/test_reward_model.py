"""The Bradley-Terry reward-model loss (core/algorithms/reward_model.py): its value, and the
surrogate's weights as the loss's gradient with respect to each score."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.core.algorithms.reward_model import bradley_terry_pairs, pair_metrics


def textbook(scores: torch.Tensor, margins: torch.Tensor, center: float) -> torch.Tensor:
    chosen, rejected = scores[0::2], scores[1::2]
    loss = -torch.nn.functional.logsigmoid(chosen - rejected - margins).mean()
    return loss + center * (chosen + rejected).square().mean()


@pytest.mark.parametrize("center", [0.0, 0.3])
def test_weights_are_the_gradient_of_the_loss(center):
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(10, generator=gen, dtype=torch.float64, requires_grad=True)
    margins = torch.rand(5, generator=gen, dtype=torch.float64)
    want = textbook(scores, margins, center)
    (grad,) = torch.autograd.grad(want, scores)
    pairs = bradley_terry_pairs(scores.detach(), margins, center)
    assert pairs.loss == pytest.approx(float(want.detach()), abs=1e-12)
    assert pairs.weights.double().tolist() == pytest.approx(grad.tolist(), abs=1e-7)  # float32 weights


def test_untrained_scores_give_log_two_and_the_metrics_count_pairs():
    pairs = bradley_terry_pairs(torch.zeros(6))
    assert pairs.loss == pytest.approx(math.log(2))
    assert pairs.metrics["reward_model/accuracy"] == 0.0  # a tie is not a win
    scores = [2.0, 1.0, 0.0, 3.0, 1.5, -1.0]  # pairs: right, wrong, right
    m = pair_metrics(scores, "eval/x/")
    assert m["eval/x/pair_accuracy"] == pytest.approx(2 / 3)
    assert m["eval/x/margin"] == pytest.approx((1.0 - 3.0 + 2.5) / 3)
    assert m["eval/x/pairs"] == 3.0


def test_the_centring_term_pulls_both_scores_of_a_pair_the_same_way():
    pairs = bradley_terry_pairs(torch.tensor([5.0, 4.0]), center_coef=1.0)
    chosen, rejected = pairs.weights.tolist()
    assert chosen > 0 and rejected > 0  # both scores are pushed down towards 0 (gradient descent)
    no_center = bradley_terry_pairs(torch.tensor([5.0, 4.0])).weights.tolist()
    assert no_center[0] == pytest.approx(-no_center[1]) and no_center[0] < 0
