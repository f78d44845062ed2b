"""Each training task's history: what the policy has shown on it lately (the pass rates and reward
means of its last explorations, when it was last explored). Difficulty filtering and the history
curriculum read it (task_selection.py); it is saved with the run's checkpoints and restored exactly.

Plain Python (no torch): the explorer and the loop, which may run without a model, keep it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..types import by_episode


@dataclass
class TaskRecord:
    pass_rates: list[float] = field(default_factory=list)
    """The fraction of responses that passed, per exploration, newest last (at most the window)."""
    reward_means: list[float] = field(default_factory=list)
    last_step: int = -1
    """The explore step it was last explored in."""
    explored: int = 0
    """Explorations in all."""

    @property
    def pass_rate(self) -> float:
        return sum(self.pass_rates) / len(self.pass_rates)

    @property
    def reward_mean(self) -> float:
        return sum(self.reward_means) / len(self.reward_means)


class TaskHistory:
    """Task id -> TaskRecord, over each task's last `window` explorations; a response passes when
    its reward is at least `success_reward`."""

    def __init__(self, window: int, success_reward: float):
        self.window, self.success_reward = window, success_reward
        self.tasks: dict[str, TaskRecord] = {}

    def record(self, exps: Iterable[Any], step: int) -> None:
        """Explore step `step`'s experiences (.group_id: the task's id), each episode counted once
        (the samples of a split one share its reward)."""
        rewards: dict[str, list[float]] = {}
        for samples in by_episode(list(exps)):
            rewards.setdefault(samples[-1].group_id, []).append(float(samples[-1].reward))
        for task_id, values in rewards.items():
            rec = self.tasks.setdefault(task_id, TaskRecord())
            rec.pass_rates = [*rec.pass_rates, sum(r >= self.success_reward for r in values) / len(values)][-self.window :]
            rec.reward_means = [*rec.reward_means, sum(values) / len(values)][-self.window :]
            rec.last_step = max(rec.last_step, step)
            rec.explored += 1

    def get(self, task_id: str) -> TaskRecord | None:
        return self.tasks.get(task_id)

    def metrics(self) -> dict[str, float]:
        """How many tasks have a history, and their mean recent pass rate."""
        if not self.tasks:
            return {"tasks/seen": 0.0}
        rates = [r.pass_rate for r in self.tasks.values()]
        return {"tasks/seen": float(len(rates)), "tasks/pass_rate_mean": sum(rates) / len(rates)}

    def state_dict(self) -> dict[str, Any]:
        return {
            task_id: [r.pass_rates, r.reward_means, r.last_step, r.explored] for task_id, r in self.tasks.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks = {
            task_id: TaskRecord([float(x) for x in p], [float(x) for x in m], int(last), int(n))
            for task_id, (p, m, last, n) in state.items()
        }
