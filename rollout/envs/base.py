"""The text environment interface behind the `multi_turn` workflow: an episode is a conversation
between the model and an environment object, one per episode."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from ...core.types import Task


@dataclass
class StepResult:
    """What the environment answers to one model reply."""

    observation: str
    """The next user/environment turn the model reads ("" when the episode is done)."""
    reward: float = 0.0
    """Reward for this step; an episode's reward is the sum over its steps."""
    done: bool = False
    """The episode is over: no further model turn."""
    messages: list[dict[str, Any]] | None = None
    """Chat turns to append instead of `observation` as one user turn (a tool's results: role
    "tool"); rendered by the chat template."""


class TextEnv(ABC):
    """One episode of a text game. Built per episode as `Env(task, args)`, `args` being the
    taskset's `workflow_args.env_args` (JSON values; raise ValueError naming a bad key); `reset`
    then gives the first observation and `step` answers each model reply. A user's environment is a
    subclass named by import path in `workflow_args.env` ('pkg.mod:Class')."""

    def __init__(self, task: Task, args: dict[str, Any]):
        self.task = task
        self.args = args
        self.metrics: dict[str, float] = {}
        """Counters of the episode (tool calls...), averaged over a step into rollout/<name>_mean."""

    @abstractmethod
    def reset(self) -> str:
        """The first observation: the model's first prompt."""

    @abstractmethod
    def step(self, reply: str) -> StepResult:
        """Answer the model's reply (its decoded text, special tokens removed)."""
