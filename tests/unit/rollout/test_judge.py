"""The `judge` reward's rules: its settings checked field by field, its parse rules on hand-written
replies, and its place among the other rewards (the service itself: tests/integration/
test_external_models.py)."""

from __future__ import annotations

import re

import pytest

from rlcore.core.config.schema import JudgeConfig
from rlcore.rollout.auxiliary import build_auxiliary
from rlcore.rollout.rewards.compose import build_reward, is_batch_reward
from rlcore.rollout.rewards.judge import Judge, check_judge, judge_settings, parse_score, parse_verdict


def settings(**changes) -> dict:
    return {**judge_settings(JudgeConfig(model="j")), **changes}


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("7", 0.7),
        ("I'd say 3, no: 8", 0.8),  # the last number said
        ("Score: 4.5", 0.45),
        ("-2", 0.0),  # below the range: clipped
        ("12", 1.0),  # above it
        ("no number here", None),
    ],
)
def test_a_score_is_the_last_number_mapped_onto_zero_one(reply: str, expected: float | None) -> None:
    got = parse_score(reply, r"(-?\d+(?:\.\d+)?)", 0.0, 10.0)
    assert got == (None if expected is None else pytest.approx(expected))


def test_a_score_pattern_picks_the_number_it_names() -> None:
    reply = "Reasoning: step 1 of 3 looks fine.\nRATING: 8/10"
    assert parse_score(reply, r"RATING:\s*(\d+)", 0.0, 10.0) == pytest.approx(0.8)
    assert parse_score(reply, r"RATING:\s*(\d+)", 1.0, 9.0) == pytest.approx(7 / 8)  # (8 - 1) / (9 - 1)
    assert parse_score("RATING: 8/10", r"\d+", 0.0, 10.0) == pytest.approx(1.0)  # no group: the whole match, "10"


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("The answer is correct.", 1.0),
        ("This is incorrect.", 0.0),  # whole words: "incorrect" is not "correct"
        ("Looks correct at first, but it is INCORRECT", 0.0),  # the verdict said last, any case
        ("Incorrect? No: correct", 1.0),
        ("corrected", None),
        ("", None),
    ],
)
def test_a_verdict_is_the_word_said_last(reply: str, expected: float | None) -> None:
    assert parse_verdict(reply, {"correct": 1.0, "incorrect": 0.0}) == expected


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model": None}, "judge.model: name the auxiliary model that judges (explorer.auxiliary_models: j)"),
        ({"model": "k"}, "judge.model: 'k' is not a configured auxiliary model"),
        ({"template": "Rate {answer}"}, "judge.template: name {response}"),
        ({"template": "Rate {response} for {user}"}, "judge.template names {user}; it may name only {prompt}, {response}, {answer}"),
        ({"template": "Rate {response"}, "judge.template: "),
        ({"parse": "vote"}, "judge.parse must be one of score, verdict; got 'vote'"),
        ({"score_pattern": "(\\d"}, "judge.score_pattern: not a regular expression"),
        ({"score_pattern": "(\\d)(\\d)"}, "judge.score_pattern: give a regular expression with at most one group"),
        ({"score_range": [10, 0]}, "judge.score_range: give [lo, hi] with lo < hi"),
        ({"score_range": ["a", 1]}, "judge.score_range"),
        ({"parse": "verdict", "verdicts": {}}, "judge.verdicts: map each verdict word"),
        ({"parse": "verdict", "verdicts": {"yes": float("nan")}}, "judge.verdicts: 'yes' needs"),
        ({"unparsed_reward": float("inf")}, "judge.unparsed_reward must be finite or null"),
        ({"max_tokens": 0}, "judge.max_tokens must be an integer >= 1"),
        ({"temperature": -1.0}, "judge.temperature must be >= 0"),
        ({"scale": 10}, "judge: unknown key(s) scale"),
    ],
)  # fmt: skip
def test_judge_settings_that_cannot_work_name_their_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        check_judge(settings(**changes), ["j"])


def test_the_default_settings_pass_and_name_every_field() -> None:
    check_judge(settings(), ["j"])
    check_judge(settings(parse="verdict"), ["j"])


def test_the_judge_is_a_batch_reward_among_the_others() -> None:
    aux = build_auxiliary([{"name": "j", "model_name": "m", "base_url": "http://127.0.0.1:9/v1"}])
    judge = Judge(settings(), aux)
    assert is_batch_reward(judge)  # one round of requests per batch
    composer = build_reward(["exact_match", "judge"], [1.0, 0.5], judge)
    assert composer.names == ["exact_match", "judge"] and composer.batched == [False, True]
    messages = judge.messages("What is 2+3?", "<answer>5</answer>", "5")
    assert messages == [{"role": "user", "content": JudgeConfig().template.format(
        prompt="What is 2+3?", response="<answer>5</answer>", answer="5")}]  # fmt: skip
    with_system = Judge(settings(system_prompt="You grade.", template="{response}"), aux)
    assert with_system.messages("p", "r", None) == [
        {"role": "system", "content": "You grade."}, {"role": "user", "content": "r"},
    ]  # fmt: skip


def test_judge_in_reward_fn_without_its_settings_says_what_it_needs() -> None:
    with pytest.raises(ValueError, match="reward_fn 'judge' asks an auxiliary model: set the taskset's judge block"):
        build_reward(["exact_match", "judge"])
