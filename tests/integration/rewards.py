"""Reward functions used by integration tests through the import-path hook ('pkg.mod:fn')."""

import zlib

from rlcore.core.types import Task


def distinct_chars(response: str, task: Task) -> float:
    """Varies between samples even for a random-init model, so GRPO advantages are non-zero."""
    return len(set(response)) / 10.0


def fails(response: str, task: Task) -> float:
    """A reward function with a bug: it raises on every response."""
    raise KeyError("no_such_column")


def fails_past_the_first_row(response: str, task: Task) -> float:
    """A bug only the second row on shows (the launch tries each reward on the first row before it
    starts): it raises on every other task."""
    if task.task_id.endswith("-0"):
        return 0.0
    raise KeyError("no_such_column")


def half_constant(response: str, task: Task) -> float:
    """The same reward for every response to an even-numbered task (a group that teaches nothing),
    distinct_chars for the others: dynamic sampling has groups to drop and groups to keep."""
    digits = "".join(c for c in task.task_id if c.isdigit())
    return 1.0 if digits and int(digits) % 2 == 0 else distinct_chars(response, task)


def solved_half(response: str, task: Task) -> float:
    """1.0 (solved) for every response to an even-numbered task, and below 1 for the others
    (distinct_chars up to 0.9): half the taskset is always solved, the rest never, yet varies."""
    digits = "".join(c for c in task.task_id if c.isdigit())
    return 1.0 if digits and int(digits) % 2 == 0 else min(distinct_chars(response, task), 0.9)


def solved_half_steady(response: str, task: Task) -> float:
    """solved_half without the variation: 1.0 for every response to an even-numbered task, 0.25 for
    every response to the others, so a run's task history is the same whatever its model samples."""
    digits = "".join(c for c in task.task_id if c.isdigit())
    return 1.0 if digits and int(digits) % 2 == 0 else 0.25


def always_nan(response: str, task: Task) -> float:
    """A reward with a bug no row escapes: never a number."""
    return float("nan")


def a_string(response: str, task: Task) -> float:
    return "1.0"  # type: ignore[return-value]


def two_in_five_constant(response: str, task: Task) -> float:
    """The same reward for every response to a task whose row number is 0 or 1 modulo 5 (no DPO
    pair), a hash of the response for the others (a pair whenever two responses differ): of 20
    tasks, 12 give pairs."""
    if int(task.task_id.rsplit("-", 1)[1]) % 5 < 2:
        return 1.0
    return zlib.crc32(response.encode()) / 2**32
