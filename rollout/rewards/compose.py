"""Combine several reward functions into one scalar, keeping each one's score for metrics."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

from ...core.registry import import_path
from ...core.types import Task
from . import REWARDS

RewardFn = Callable[[str, Task], float]

CORRECTNESS_REWARDS = ("exact_match", "numeric", "math")
"""Registered rewards that say whether the answer is right; evaluation reports them as accuracy."""


class RewardComposer:
    """`reward(response, task) -> (weighted sum, {name: unweighted score})`."""

    def __init__(self, names: list[str], fns: list[RewardFn], weights: list[float]):
        assert len(names) == len(fns) == len(weights)
        self.names = names
        self.fns = fns
        self.weights = weights

    def __call__(self, response: str, task: Task) -> tuple[float, dict[str, float]]:
        scores: dict[str, float] = {}
        for name, fn in zip(self.names, self.fns, strict=True):
            try:
                value = fn(response, task)
            except Exception as e:
                raise ValueError(f"reward_fn '{name}' failed on task {task.task_id}: {e}") from e
            # a number, not something float() happens to accept ("1.0", a tensor): a bug would pass
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(
                    f"reward_fn '{name}' returned {value!r} ({type(value).__name__}) on task {task.task_id}: "
                    "a reward function must return a finite real number (bool, int, float)"
                )
            scores[name] = float(value)
        total = sum(w * scores[name] for name, w in zip(self.names, self.weights, strict=True))
        return total, scores

    @property
    def correctness_names(self) -> list[str]:
        return [name for name in self.names if name in CORRECTNESS_REWARDS]


def resolve_reward(name: str) -> RewardFn:
    """A registered reward name, or an import path 'pkg.mod:fn' to a user function."""
    fn = REWARDS.resolve(name) if name in REWARDS or ":" not in name else import_path(name, what="reward_fn")
    if not callable(fn):
        raise ValueError(
            f"reward_fn '{name}' is not callable (got {type(fn).__name__}); "
            "give a function (response: str, task: Task) -> float"
        )
    return fn


def build_reward(names: list[str], weights: list[float] | None = None) -> RewardComposer:
    """Resolve `names` (see `resolve_reward`); `weights` None or empty means 1.0 each."""
    if not names:
        raise ValueError(f"reward_fn: give at least one reward function ({', '.join(REWARDS)})")
    if len(set(names)) != len(names):
        raise ValueError(f"reward_fn lists a function twice: {names}; give each once and weight it instead")
    if not weights:
        weights = [1.0] * len(names)
    if len(weights) != len(names):
        raise ValueError(
            f"reward_weights has {len(weights)} entries but reward_fn has {len(names)}; "
            "give one weight per reward function or none"
        )
    return RewardComposer(list(names), [resolve_reward(n) for n in names], [float(w) for w in weights])
