"""Rewards of a reasoning model (format.reasoning_tags): every reward function scores the answer after
the reasoning block, batch functions may read the reasoning, a block that never closes scores as no
answer, and the tags reach a rollout worker over the wire."""

from __future__ import annotations

import pytest

from rlcore.client.rollout import workflow_to_proto
from rlcore.core.reasoning import split_reasoning
from rlcore.core.types import Task, WorkflowSpec
from rlcore.rollout.rewards.compose import build_reward

TAGS = ["<think>", "</think>"]
TASK = Task("t", "1+1=", "2")


@pytest.mark.parametrize(
    ("response", "answer", "reasoning"),
    [
        ("<think>\n1 and 1 make 2\n</think>\n\n2", "2", "1 and 1 make 2"),  # the model opened the block
        ("1 and 1 make 2\n</think>\n\n2", "2", "1 and 1 make 2"),  # the template opened it in the prompt
        ("<think>\nstill thinking when max_tokens", "", "still thinking when max_tokens"),  # never closed
        ("2", "2", ""),  # no block: all answer
        ("<think></think>2 </think> 3", "2 </think> 3", ""),  # only the first closing tag ends the block
    ],
)
def test_the_answer_is_what_follows_the_reasoning_block(response: str, answer: str, reasoning: str) -> None:
    assert split_reasoning(response, TAGS) == (answer, reasoning)
    assert split_reasoning(response, []) == (response, "")


def seen_reasoning(
    completions: list[str], answer: list[str], reasoning: list[str], **_: object
) -> list[float]:
    """A batch reward paying for reasoning that reaches the right answer."""
    return [float(a in r) for a, r in zip(answer, reasoning, strict=True)]


def test_every_reward_scores_the_answer_and_batch_rewards_read_the_reasoning() -> None:
    responses = [
        "<think>\n1+1 is 2\n</think>\n\n<answer>2</answer>",
        "<think>\n1+1 is 2, so 3\n</think>\n\n<answer>3</answer>",
        "<think>\na draft: <answer>2</answer>, let me check",  # cut off by max_tokens while thinking
    ]
    tasks = [TASK] * 3
    plain = build_reward(["exact_match"])  # the draft inside unfinished reasoning is taken as the answer
    assert [s for s, _ in plain.score_batch(responses, tasks)] == [1.0, 0.0, 1.0]
    seen = f"{__name__}:seen_reasoning"
    reward = build_reward(["exact_match", seen], [1.0, 0.5], reasoning_tags=TAGS)
    scored = reward.score_batch(responses, tasks)
    assert [parts for _, parts in scored] == [
        {"exact_match": 1.0, seen: 1.0},
        {"exact_match": 0.0, seen: 1.0},
        {"exact_match": 0.0, seen: 1.0},  # no answer: the block never closed
    ]
    assert [total for total, _ in scored] == [1.5, 0.5, 0.5]
    assert reward(responses[0], TASK) == scored[0]  # the per-response call splits the same way
    with pytest.raises(ValueError, match="reasoning"):  # without tags there is no reasoning column to read
        build_reward([seen]).score_batch(responses, tasks)


def test_bad_tags_are_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"format\.reasoning_tags: give \[open, close\]"):
        build_reward(["exact_match"], reasoning_tags=["</think>", "</think>"])


def test_the_tags_travel_to_a_rollout_worker() -> None:
    msg = workflow_to_proto(WorkflowSpec(reward_fn=["exact_match"], reasoning_tags=TAGS))
    assert list(msg.reasoning_tags) == TAGS
    assert list(workflow_to_proto(WorkflowSpec(reward_fn=["exact_match"])).reasoning_tags) == []
