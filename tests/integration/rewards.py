"""Reward functions used by integration tests through the import-path hook ('pkg.mod:fn')."""

from rlcore.core.types import Task


def distinct_chars(response: str, task: Task) -> float:
    """Varies between samples even for a random-init model, so GRPO advantages are non-zero."""
    return len(set(response)) / 10.0


def fails(response: str, task: Task) -> float:
    """A reward function with a bug: it raises on every response."""
    raise KeyError("no_such_column")
