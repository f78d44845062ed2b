"""Answer-checking rewards. Every reward has the signature `fn(response: str, task: Task) -> float`.

The model is asked to put its final answer inside `<answer>...</answer>`; when it writes the tag
more than once the last one counts, as a model that corrects itself ends with its final answer.
"""

from __future__ import annotations

import math
import re

from ...core.types import Task

OPEN, CLOSE = "<answer>", "</answer>"

# A whole string that is a number: 12, -3.5, .5, 1,234,567.8, 3/4 (no thousands separators in fractions).
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+|[+-]?\d+/\d+")
# A number inside running text: a sign only counts when it does not follow a word ("3-4" ends in 4).
_NUMBER_IN_TEXT = re.compile(
    r"(?<![\w.,/])(?:-(?=[\d.]))?(?:\d+/\d+(?![\d,])|(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
)


def extract_answer(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>`, stripped; None when there is none."""
    end = text.rfind(CLOSE)
    if end < 0:
        return None
    start = text.rfind(OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(OPEN) : end].strip()


def _ground_truth(task: Task, reward: str) -> str:
    if task.answer is None:
        raise ValueError(f"{reward} needs task.answer; task '{task.task_id}' has none")
    return task.answer.strip()


def exact_match(response: str, task: Task) -> float:
    """1.0 when the tagged answer equals the ground truth exactly (after stripping whitespace)."""
    return 1.0 if extract_answer(response) == _ground_truth(task, "exact_match") else 0.0


def parse_number(text: str) -> float | None:
    """`text` as a number when all of it is one (a trailing period allowed), else None."""
    text = text.strip()
    if text.endswith("."):
        text = text[:-1]
    if not _NUMBER.fullmatch(text):
        return None
    if "/" in text:
        num, den = text.split("/")
        return None if int(den) == 0 else int(num) / int(den)
    return float(text.replace(",", ""))


def last_number(text: str) -> str | None:
    """The last number written in running text, or None."""
    found = _NUMBER_IN_TEXT.findall(text)
    return found[-1] if found else None


def numeric_match(response: str, task: Task) -> float:
    """1.0 when the answer and the ground truth are the same number (relative tolerance 1e-6).

    The answer is the tagged one, or without a tag the last number in the response, so that
    models not yet trained on the tag format still get a signal.
    """
    truth = parse_number(_ground_truth(task, "numeric"))
    answer = extract_answer(response)
    if answer is None:
        answer = last_number(response)
    value = None if answer is None else parse_number(answer)
    if truth is None or value is None:
        return 0.0
    return 1.0 if math.isclose(value, truth, rel_tol=1e-6) else 0.0


def format_reward(response: str, task: Task) -> float:
    """1.0 for exactly one non-empty `<answer>...</answer>` that ends the response (whitespace aside)."""
    if response.count(OPEN) != 1 or response.count(CLOSE) != 1:
        return 0.0
    start, end = response.find(OPEN), response.find(CLOSE)
    if end < start or not response[start + len(OPEN) : end].strip():
        return 0.0
    return 1.0 if not response[end + len(CLOSE) :].strip() else 0.0
