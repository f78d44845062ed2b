"""Length shaping (algorithm.length_penalty, core/algorithms/length.py): Kimi k1.5's length reward,
lambda = 0.5 - (n - n_min) / (n_max - n_min) within a task's group, on every response (kind group:
a wrong one only loses) or on the correct ones alone (kind correct)."""

from __future__ import annotations

import random

import pytest

from rlcore.core.algorithms.length import length_rewards
from rlcore.core.config import ConfigError
from rlcore.core.config.schema import AlgorithmConfig, LengthPenaltyConfig
from rlcore.core.types import Experience
from rlcore.runtime.scoring import length_terms, shaped_scores

from ..config.minimal import resolve


def test_the_group_rule_is_the_papers_by_hand() -> None:
    # lengths 2..10: lambda = 0.5 - (n - 2) / 8 = 0.5, 0.25, 0, -0.5; correct ones gain coef * lambda,
    # wrong ones coef * min(0, lambda)
    got = length_rewards([2, 4, 6, 10], [1.0, 1.1, 0.0, 0.1], ["g"] * 4, "group", 0.2, 1.0)
    assert got == pytest.approx([0.1, 0.05, 0.0, -0.1])
    # a wrong answer as short as the shortest gains nothing
    assert length_rewards([2, 6], [0.0, 1.0], ["g", "g"], "group", 0.2, 1.0) == pytest.approx([0.0, -0.1])


def test_the_correct_rule_shapes_the_correct_responses_among_themselves() -> None:
    # the correct ones (lengths 2 and 4) span the range; the wrong ones, shorter or longer, keep their reward
    got = length_rewards([2, 4, 1, 10], [1.0, 1.0, 0.0, 0.0], ["g"] * 4, "correct", 0.2, 1.0)
    assert got == pytest.approx([0.1, -0.1, 0.0, 0.0])
    # one correct response: no other to compare it with
    assert length_rewards([2, 4], [1.0, 0.0], ["g", "g"], "correct", 0.2, 1.0) == [0.0, 0.0]


def test_groups_are_shaped_apart_and_one_length_is_no_preference() -> None:
    got = length_rewards([3, 3, 2, 6], [1.0, 1.0, 1.0, 1.0], ["a", "a", "b", "b"], "group", 1.0, 1.0)
    assert got == pytest.approx([0.0, 0.0, 0.5, -0.5])


def test_a_wrong_response_never_gains_and_terms_stay_within_half_coef() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        lengths = [rng.randint(1, 20) for _ in range(n)]
        rewards = [rng.choice([0.0, 0.5, 1.0, 1.1]) for _ in range(n)]
        groups = [rng.choice("ab") for _ in range(n)]
        for kind in ("group", "correct"):
            got = length_rewards(lengths, rewards, groups, kind, 0.3, 1.0)
            assert all(abs(t) <= 0.15 + 1e-12 for t in got)
            wrong = [t for t, r in zip(got, rewards, strict=True) if r < 1.0]
            assert all(t <= 0.0 for t in wrong) if kind == "group" else all(t == 0.0 for t in wrong)


def _exp(
    n: int, reward: float, group: str, episode: str = "", loss_mask: list[int] | None = None
) -> Experience:
    return Experience(
        [1], list(range(n)), [0.0] * n, reward, group, loss_mask=loss_mask or [], episode_id=episode
    )


def test_the_step_adds_the_term_to_the_rewards_and_reports_it() -> None:
    exps = [_exp(2, 1.0, "g"), _exp(6, 1.0, "g"), _exp(4, 0.0, "g"), _exp(3, 1.0, "h")]
    algo = AlgorithmConfig(length_penalty=LengthPenaltyConfig(kind="group", coef=0.2))
    metrics: dict[str, float] = {}
    scores = shaped_scores(exps, algo, 8, metrics)
    assert scores.tolist() == pytest.approx([1.1, 0.9, 0.0, 1.0])
    assert metrics["rollout/length_penalty"] == pytest.approx(0.0)
    plain: dict[str, float] = {}
    assert shaped_scores(exps, AlgorithmConfig(), 8, plain).tolist() == [1.0, 1.0, 0.0, 1.0]
    assert "rollout/length_penalty" not in plain


def test_an_episodes_samples_share_one_term_of_the_episodes_model_tokens() -> None:
    # episode e: two samples of 3 model tokens (a 2-token tool result in the second is not the model's)
    exps = [
        _exp(3, 1.0, "g", "e"),
        _exp(5, 1.0, "g", "e", loss_mask=[1, 1, 0, 0, 1]),
        _exp(2, 1.0, "g"),
    ]
    terms = length_terms(exps, LengthPenaltyConfig(kind="correct", coef=0.2))
    assert terms == pytest.approx([-0.1, -0.1, 0.1])  # the episode: 6 model tokens, the other 2


def test_two_tasks_episodes_of_one_name_are_two_episodes() -> None:
    # an agent names its episodes; tasks a and b both use "x" and "y" (core/types.py episode_key)
    exps = [_exp(4, 1.0, "a", "x"), _exp(16, 1.0, "a", "y"), _exp(16, 1.0, "b", "x"), _exp(4, 1.0, "b", "y")]
    terms = length_terms(exps, LengthPenaltyConfig(kind="group", coef=1.0))
    assert terms == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_length_shaping_needs_groups_to_compare(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^algorithm\.length_penalty\.kind group compares the lengths of the "
                       r"responses to one task, and algorithm\.repeat_times is 1: set repeat_times to 2 or more, or "
                       r"kind none$"):  # fmt: skip
        resolve(tmp_path, "algorithm.length_penalty.kind=group", "algorithm.repeat_times=1",
                "algorithm.algorithm_type=reinforce_plus_plus")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^algorithm\.length_penalty\.kind: algorithm\.length_penalty is read only "
                       r"by an advantage of rollouts' rewards, and algorithm\.algorithm_type sft computes no advantage of "
                       r"rollouts' rewards \(it would change nothing\): set algorithm\.algorithm_type to an RL algorithm, "
                       r"or drop algorithm\.length_penalty "):  # fmt: skip
        resolve(
            tmp_path, "mode=train", "algorithm.algorithm_type=sft", "algorithm.length_penalty.kind=correct"
        )
    with pytest.raises(
        ConfigError,
        match=r"^algorithm\.length_penalty\.kind must be one of none, group, correct; got .shortest.$",
    ):
        resolve(tmp_path, "algorithm.length_penalty.kind=shortest")
    assert resolve(tmp_path, "algorithm.length_penalty.kind=correct").algorithm.length_penalty.coef == 0.1


def test_the_term_is_read_only_where_rewards_make_the_advantage() -> None:
    from rlcore.core.algorithms import sections_read

    for algorithm_type in ("grpo", "ppo", "dapo", "rloo", "opmd"):
        assert "length_penalty" in sections_read(AlgorithmConfig(algorithm_type=algorithm_type)), (
            algorithm_type
        )
    # on-policy distillation's advantage is the teacher's alone (zero from rewards); SFT and DPO explore nothing
    for algorithm_type in ("on_policy_distill", "sft", "dpo"):
        assert "length_penalty" not in sections_read(AlgorithmConfig(algorithm_type=algorithm_type)), (
            algorithm_type
        )
