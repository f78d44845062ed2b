"""Answer rewards and their composition, case by case."""

from __future__ import annotations

import pytest

from rlcore.core.types import Task
from rlcore.rollout.rewards import REWARDS
from rlcore.rollout.rewards.answer import (
    exact_match,
    extract_answer,
    format_reward,
    numeric_match,
    parse_number,
)
from rlcore.rollout.rewards.compose import build_reward


def task(answer: str | None = "42") -> Task:
    return Task(task_id="t7", prompt="q", answer=answer)


def shout(response: str, task: Task) -> float:
    """A user reward reached by import path in the tests below."""
    return 2.0 if response.isupper() else 0.0


def broken(response: str, task: Task) -> float:
    raise RuntimeError("boom")


NOT_A_FUNCTION = 3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>42</answer>", "42"),
        ("<answer>  4 2 \n</answer>", "4 2"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),  # the last one counts
        ("<answer>1</answer> then <answer>2", "1"),  # an unclosed tag is not an answer
        ("<answer>a<answer>b</answer>", "b"),
        ("<answer></answer>", ""),
        ("42", None),
        ("</answer>42<answer>", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("<answer>42</answer>", "42", 1.0),
        ("<answer> 42 </answer>", " 42\n", 1.0),
        ("<answer>42.0</answer>", "42", 0.0),  # exact: no numeric equivalence
        ("42", "42", 0.0),  # no tag, no answer
        ("<answer>41</answer><answer>42</answer>", "42", 1.0),
    ],
)
def test_exact_match(response: str, answer: str, expected: float) -> None:
    assert exact_match(response, task(answer)) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", 42.0),
        ("-7", -7.0),
        ("+7", 7.0),
        ("3.25", 3.25),
        (".5", 0.5),
        ("1,234", 1234.0),
        ("-1,234,567.5", -1234567.5),
        ("3/4", 0.75),
        ("-3/4", -0.75),
        ("42.", 42.0),
        (" 12 ", 12.0),
        ("1/0", None),
        ("12,34", None),  # not a thousands grouping
        ("1,2345", None),
        ("forty-two", None),
        ("4 2", None),
        ("", None),
        (".", None),
    ],
)
def test_parse_number(text: str, expected: float | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("<answer>42</answer>", "42", 1.0),
        ("<answer>42.0</answer>", "42", 1.0),
        ("<answer>1,234</answer>", "1234", 1.0),
        ("<answer>0.75</answer>", "3/4", 1.0),
        ("<answer>42.</answer>", "42", 1.0),
        ("<answer>-5</answer>", "5", 0.0),
        ("<answer>1000000.5</answer>", "1000000", 1.0),  # |diff| / 1e6 = 5e-7 < 1e-6
        ("<answer>1000002</answer>", "1000000", 0.0),  # 2e-6 > 1e-6
        ("<answer>x = 42</answer>", "42", 0.0),  # a tag that holds no number
        ("<answer>42</answer>", "forty-two", 0.0),  # ground truth that is no number
        # No tag: the last number in the text; a '-' after a word/digit is subtraction, not a sign.
        ("7 + 35 = 42", "42", 1.0),
        ("so 50-8 gives 42.", "42", 1.0),
        ("it is 1,234 in total", "1234", 1.0),
        ("we get 45-3", "42", 0.0),  # last number is 3, not -3
        ("the answer is -3", "-3", 1.0),
        ("half: 1/2", "0.5", 1.0),
        ("no number here", "42", 0.0),
    ],
)
def test_numeric_match(response: str, answer: str, expected: float) -> None:
    assert numeric_match(response, task(answer)) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("think <answer>42</answer>", 1.0),
        ("<answer>42</answer>  \n", 1.0),
        ("<answer>42</answer>.", 0.0),  # text after the answer
        ("<answer> </answer>", 0.0),  # empty content
        ("<answer>1</answer><answer>2</answer>", 0.0),  # two answers
        ("</answer>42<answer>", 0.0),  # reversed tags
        ("<answer>42", 0.0),
        ("42", 0.0),
    ],
)
def test_format_reward(response: str, expected: float) -> None:
    assert format_reward(response, task()) == expected


def test_correctness_rewards_need_a_ground_truth() -> None:
    with pytest.raises(ValueError, match="task 't7' has none"):
        exact_match("<answer>1</answer>", task(None))


def test_registry_entries_resolve_to_the_answer_functions() -> None:
    assert REWARDS.resolve("exact_match") is exact_match
    assert REWARDS.resolve("numeric") is numeric_match
    assert REWARDS.resolve("format") is format_reward


def test_composer_weights_registered_and_imported_rewards() -> None:
    reward = build_reward(["numeric", "format", f"{__name__}:shout"], [1.0, 0.5, 0.25])
    total, parts = reward("<answer>42</answer>", task("42"))
    # numeric 1.0, format 1.0, shout 0.0 (lower case tags): 1.0 * 1 + 0.5 * 1 + 0.25 * 0 = 1.5
    assert parts == {"numeric": 1.0, "format": 1.0, f"{__name__}:shout": 0.0}
    assert total == 1.5
    total, parts = reward("FORTY-TWO", task("42"))
    # numeric 0, format 0, shout 2.0: 0.25 * 2.0 = 0.5
    assert total == 0.5 and parts[f"{__name__}:shout"] == 2.0
    assert reward.correctness_names == ["numeric"]


def test_composer_default_weights_are_one() -> None:
    for weights in (None, []):
        reward = build_reward(["exact_match", "rlcore.rollout.rewards.answer:format_reward"], weights)
        # exact 1 + format 1 = 2
        assert reward("<answer>42</answer>", task("42")) == (
            2.0,
            {"exact_match": 1.0, "rlcore.rollout.rewards.answer:format_reward": 1.0},
        )
        assert reward.correctness_names == ["exact_match"]


@pytest.mark.parametrize(
    "names, weights, message",
    [
        (["nope"], None, "reward_fn must be one of exact_match, numeric, format, math, judge, reward_model; got 'nope'"),
        ([f"{__name__}:missing"], None, "has no attribute 'missing'"),
        ([f"{__name__}:NOT_A_FUNCTION"], None, r"is not callable \(got int\)"),
        (["format", "exact_match"], [1.0], "reward_weights has 1 entries but reward_fn has 2"),
        (["format", "format"], None, "lists a function twice"),
        ([], None, "at least one"),
    ],
)
def test_build_reward_rejects_bad_input(names: list[str], weights: list[float] | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_reward(names, weights)


def test_failing_reward_names_itself_and_the_task() -> None:
    reward = build_reward(["format", f"{__name__}:broken"], None)
    with pytest.raises(ValueError, match=rf"reward_fn '{__name__}:broken' failed on task t7: boom"):
        reward("<answer>1</answer>", task())


def text_score(response: str, task: Task) -> str:
    return "1.0"


def nan_score(response: str, task: Task) -> float:
    return float("nan")


def numpy_score(response: str, task: Task):
    import numpy as np

    return np.float32(0.5)


@pytest.mark.parametrize(("fn", "shown"), [("text_score", "'1.0' (str)"), ("nan_score", "nan (float)")])
def test_a_reward_that_is_not_a_finite_number_names_the_function_and_the_task(fn: str, shown: str) -> None:
    reward = build_reward(["format", f"{__name__}:{fn}"], None)
    with pytest.raises(ValueError) as e:
        reward("<answer>1</answer>", task())
    assert str(e.value).startswith(f"reward_fn '{__name__}:{fn}' returned {shown} on task t7: ")


def test_a_numpy_scalar_reward_is_a_number() -> None:
    total, scores = build_reward([f"{__name__}:numpy_score"], None)("x", task())
    assert total == scores[f"{__name__}:numpy_score"] == 0.5


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),  # a decimal equals the LaTeX fraction
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # no tag: the boxed answer
        ("<answer>1/2</answer>", "0.5", 1.0),
        ("<answer>2\\sqrt{2}</answer>", "\\sqrt{8}", 1.0),  # equal after simplification
        ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", 1.0),  # sets compare unordered
        ("The answer is $x = 3$", "3", 1.0),
        ("<answer>4</answer>", "3", 0.0),
        ("<answer>abc</answer>", "12", 0.0),  # nothing mathematical to compare
        ("I do not know", "3", 0.0),
    ],
)
def test_math_reward_accepts_equivalent_forms(response: str, answer: str, expected: float) -> None:
    assert REWARDS.resolve("math")(response, task(answer)) == expected


def test_math_reward_runs_off_the_main_thread_and_needs_an_answer() -> None:
    import threading

    out: list[float] = []
    worker = threading.Thread(
        target=lambda: out.append(REWARDS.resolve("math")("<answer>0.5</answer>", task("1/2")))
    )
    worker.start()
    worker.join()
    assert out == [1.0]  # math-verify's SIGALRM bound is main-thread only: off it, it runs without
    with pytest.raises(ValueError, match="math needs task.answer"):
        REWARDS.resolve("math")("<answer>1</answer>", task(None))
    assert build_reward(["math", "format"]).correctness_names == ["math"]


def trl_length(completions, **kwargs) -> list[float]:
    """TRL's batch form, reading a column by name (`answer`) from its kwargs."""
    return [float(len(c)) + (kwargs["answer"][i] == "42") for i, c in enumerate(completions)]


def trl_declared(prompts, completions, answer) -> list[float]:
    """TRL's batch form that declares its columns (no **kwargs): only those are passed."""
    CALLS.append(len(completions))
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer, strict=True)]


def trl_short(completions, **kwargs) -> list[float]:
    return [1.0]


def trl_none(completions, **kwargs) -> list:
    return [None for _ in completions]


CALLS: list[int] = []


def test_trl_batch_rewards_are_called_once_per_batch_with_the_columns_by_name() -> None:
    CALLS.clear()
    reward = build_reward(["format", f"{__name__}:trl_length", f"{__name__}:trl_declared"], [1.0, 0.5, 2.0])
    scored = reward.score_batch(["<answer>42</answer>", "no"], [task("42"), task("7")])
    assert CALLS == [2]  # one call for both completions
    assert scored[0][1] == {"format": 1.0, f"{__name__}:trl_length": 20.0, f"{__name__}:trl_declared": 1.0}
    assert scored[0][0] == 1.0 + 0.5 * 20.0 + 2.0 * 1.0
    assert scored[1][1] == {"format": 0.0, f"{__name__}:trl_length": 2.0, f"{__name__}:trl_declared": 0.0}
    assert reward("no", task("42"))[1][f"{__name__}:trl_length"] == 3.0  # one response: a batch of one


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("trl_short", r"returned 1 values for 2 completions: return one number per completion, in order$"),
        ("trl_none", r"returned None \(NoneType\) on task t7: a reward function must return a finite real number"),
    ],
)
def test_a_batch_reward_with_the_wrong_answer_names_itself(name: str, message: str) -> None:
    reward = build_reward([f"{__name__}:{name}"])
    with pytest.raises(ValueError, match=rf"reward_fn '{__name__}:{name}'.*{message}"):
        reward.score_batch(["a", "b"], [task("1"), task("2")])
