"""Evaluation with n samples per task: pass@k's unbiased estimator and maj@n against values worked
out by hand."""

from __future__ import annotations

import math

import pytest

from rlcore.core.step_metrics import pass_at_k, sampled_eval_metrics


def test_pass_at_k_is_one_minus_the_chance_that_k_draws_miss_every_correct_sample() -> None:
    # n = 5, c = 2: 1 - C(3, k) / C(5, k)
    for k in range(1, 6):
        want = 1 - (math.comb(3, k) / math.comb(5, k) if k <= 3 else 0.0)
        assert pass_at_k(5, 2, k) == pytest.approx(want)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(200, 10, 1) == pytest.approx(10 / 200)  # pass@1 is the share correct
    assert 0.0 < pass_at_k(1000, 1, 100) < 1.0  # large n: no overflow


def test_sampled_metrics_of_two_tasks_of_four_samples() -> None:
    correct = [[True, False, False, True], [False, False, False, False]]
    answers = [["7", "6", "6", "7"], ["1", "2", "2", "3"]]  # task 0: a tie, the first seen (7) wins
    got = sampled_eval_metrics(correct, answers)
    assert got == pytest.approx({
        "avg@4": 2 / 8,
        "pass@1": (0.5 + 0.0) / 2,
        "pass@2": (1 - math.comb(2, 2) / math.comb(4, 2)) / 2,  # task 0: 1 - 1/6
        "pass@4": (1.0 + 0.0) / 2,
        "maj@4": (1 + 0) / 2,
    })  # fmt: skip
    # the majority answer wrong while a minority one is right: maj@n 0, pass@n 1
    assert sampled_eval_metrics([[False, False, True]], [["5", "5", "4"]])["maj@3"] == 0.0
