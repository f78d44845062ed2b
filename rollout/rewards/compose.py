"""Combine several reward functions into one scalar, keeping each one's score for metrics.

A reward function is rlcore's per-response `fn(response: str, task: Task) -> float`, or TRL's batch
form, `fn(prompts, completions, **columns) -> list[float]` (any function with a `completions`
parameter): it is called once per batch with the prompts, the completions (text) and the task
columns by name (`answer`, `task_id`, and every other column of the taskset's rows, a list each),
only those it declares unless it takes **kwargs. With reasoning tags (core/reasoning.py) every
function scores the answer after the reasoning block, and batch functions may also take the
`reasoning` column.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from ...core.reasoning import reasoning_tags_problem, split_reasoning
from ...core.registry import import_path
from ...core.types import Task
from ..auxiliary import AuxiliaryError
from . import REWARDS
from .judge import JUDGE
from .reward_model import REWARD_MODEL

RewardFn = Callable[[str, Task], float]

CORRECTNESS_REWARDS = ("exact_match", "numeric", "math")
"""Registered rewards that say whether the answer is right; evaluation reports them as accuracy."""


def is_batch_reward(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is TRL's batch form (it has a `completions` parameter)."""
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the per-response form
        return False


def _checked(name: str, value: Any, task: Task) -> float:
    # a number, not something float() happens to accept ("1.0", a tensor): a bug would pass
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(
            f"reward_fn '{name}' returned {value!r} ({type(value).__name__}) on task {task.task_id}: "
            "a reward function must return a finite real number (bool, int, float)"
        )
    return float(value)


class RewardComposer:
    """`reward(response, task) -> (weighted sum, {name: unweighted score})`; `score_batch` scores many
    at once (a batch reward function is called once for them all)."""

    def __init__(
        self,
        names: list[str],
        fns: list[Callable[..., Any]],
        weights: list[float],
        reasoning_tags: Sequence[str] = (),
    ):
        assert len(names) == len(fns) == len(weights)
        self.names = names
        self.fns = fns
        self.weights = weights
        self.batched = [is_batch_reward(fn) for fn in fns]
        self.reasoning_tags = list(reasoning_tags)

    def __call__(self, response: str, task: Task) -> tuple[float, dict[str, float]]:
        return self.score_batch([response], [task])[0]

    def score_batch(
        self, responses: Sequence[str], tasks: Sequence[Task]
    ) -> list[tuple[float, dict[str, float]]]:
        """Each response's (weighted sum, {name: unweighted score}); `tasks[i]` is response i's task."""
        assert len(responses) == len(tasks), "one task per response"
        split = [split_reasoning(r, self.reasoning_tags) for r in responses]
        responses, reasoning = [a for a, _ in split], [r for _, r in split]
        scores: list[dict[str, float]] = [{} for _ in responses]
        for name, fn, batched in zip(self.names, self.fns, self.batched, strict=True):
            values = (
                self._batch(name, fn, responses, tasks, reasoning if self.reasoning_tags else None) if batched
                else [self._one(name, fn, r, t) for r, t in zip(responses, tasks, strict=True)]
            )  # fmt: skip
            for s, v in zip(scores, values, strict=True):
                s[name] = v
        weights = list(zip(self.names, self.weights, strict=True))
        return [(sum(w * s[name] for name, w in weights), s) for s in scores]

    @staticmethod
    def _one(name: str, fn: RewardFn, response: str, task: Task) -> float:
        try:
            value = fn(response, task)
        except AuxiliaryError:
            raise  # a service failing names itself, and the batch is retried
        except Exception as e:
            raise ValueError(f"reward_fn '{name}' failed on task {task.task_id}: {e}") from e
        return _checked(name, value, task)

    @staticmethod
    def _batch(
        name: str, fn: Callable[..., Any], responses: Sequence[str], tasks: Sequence[Task],
        reasoning: Sequence[str] | None,
    ) -> list[float]:  # fmt: skip
        columns: dict[str, list[Any]] = {
            "prompts": [t.prompt for t in tasks], "completions": list(responses),
            "answer": [t.answer for t in tasks], "task_id": [t.task_id for t in tasks],
        }  # fmt: skip
        if reasoning is not None:
            columns["reasoning"] = list(reasoning)
        for key in dict.fromkeys(k for t in tasks for k in t.metadata):
            columns.setdefault(key, [t.metadata.get(key) for t in tasks])
        params = inspect.signature(fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            columns = {k: v for k, v in columns.items() if k in params}
        try:
            values = fn(**columns)
        except AuxiliaryError:
            raise
        except Exception as e:
            raise ValueError(
                f"reward_fn '{name}' failed on a batch of {len(tasks)} (task {tasks[0].task_id} first): {e}"
            ) from e
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != len(tasks):
            got = f"{len(values)} values" if isinstance(values, Sequence) else type(values).__name__
            raise ValueError(
                f"reward_fn '{name}' (a batch reward: it takes completions) returned {got} for {len(tasks)} "
                "completions: return one number per completion, in order"
            )
        return [_checked(name, v, t) for v, t in zip(values, tasks, strict=True)]

    @property
    def correctness_names(self) -> list[str]:
        return correctness_names(self.names)


def correctness_names(names: Sequence[str]) -> list[str]:
    """The rewards among `names` that say whether the answer is right (reported as accuracy)."""
    return [name for name in names if name in CORRECTNESS_REWARDS]


def resolve_reward(name: str) -> RewardFn:
    """A registered reward name, or an import path 'pkg.mod:fn' to a user function. The judge is
    built by build_reward, from its taskset's settings."""
    if name == JUDGE:
        raise ValueError(
            "reward_fn 'judge' asks an auxiliary model: set the taskset's judge block (model, template, parse)"
        )
    if name == REWARD_MODEL:
        raise ValueError("reward_fn 'reward_model' scores with a reward model: set the taskset's reward_model.path")
    fn = REWARDS.resolve(name) if name in REWARDS or ":" not in name else import_path(name, what="reward_fn")
    if not callable(fn):
        raise ValueError(
            f"reward_fn '{name}' is not callable (got {type(fn).__name__}); "
            "give a function (response: str, task: Task) -> float"
        )
    return fn


def build_reward(
    names: list[str], weights: list[float] | None = None, judge: Callable[..., list[float]] | None = None,
    reasoning_tags: Sequence[str] = (), reward_model: Callable[..., list[float]] | None = None,
) -> RewardComposer:  # fmt: skip
    """Resolve `names` (see `resolve_reward`); `weights` None or empty means 1.0 each; `judge` is
    the taskset's Judge, for 'judge' in `names`, and `reward_model` its RewardModelScorer, for
    'reward_model'; `reasoning_tags` [open, close] (or empty) name the reasoning block the functions
    do not score."""
    why = reasoning_tags_problem(reasoning_tags)
    if why is not None:
        raise ValueError(f"format.reasoning_tags: {why}")
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
    built = {n: fn for n, fn in ((JUDGE, judge), (REWARD_MODEL, reward_model)) if fn is not None}
    fns = [built[n] if n in built else resolve_reward(n) for n in names]  # resolve_reward says what one needs
    return RewardComposer(list(names), fns, [float(w) for w in weights], reasoning_tags)
