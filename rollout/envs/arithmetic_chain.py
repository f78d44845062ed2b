"""The built-in `multi_turn` example game: a chain of additions where each question builds on the
model's previous answer.

Turn 1 asks the task's prompt ("12+7="). The model answers "<answer>19</answer>"; the environment
then asks to add the next of the row's `addends` to *that answer* ("19+5="), and so on. Each step
is graded on its own question (answer == previous answer + addend), so a wrong step costs its own
credit and changes what comes next; an unreadable answer ends the episode. The episode's reward is
the share of the chain's steps answered right (0 to 1).
"""

from __future__ import annotations

import re
from typing import Any

from ...core.types import Task
from .base import StepResult, TextEnv

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


class ArithmeticChainEnv(TextEnv):
    """Rows: {"prompt": "a+b=", "addends": [c, d, ...]} (core/data/synthetic.py writes them)."""

    def __init__(self, task: Task, args: dict[str, Any]):
        super().__init__(task, args)
        addends = task.metadata.get("addends")
        if not isinstance(addends, list) or not all(isinstance(a, int) for a in addends):
            raise ValueError(
                f"task {task.task_id}: column 'addends' must be a list of integers; got {addends!r}"
            )
        match = re.fullmatch(r"\s*(-?\d+)\s*\+\s*(-?\d+)\s*=\s*", task.prompt)
        if match is None:
            raise ValueError(f"task {task.task_id}: prompt must read 'a+b='; got {task.prompt!r}")
        self.addends = list(addends)
        self.expected = int(match[1]) + int(match[2])
        self.steps = 1 + len(self.addends)
        self.done_steps = 0

    def reset(self) -> str:
        return self.task.prompt

    def step(self, reply: str) -> StepResult:
        match = ANSWER.search(reply)
        if match is None:  # nothing to build the next question on
            return StepResult("", 0.0, done=True)
        answer = int(match[1])
        reward = (answer == self.expected) / self.steps
        self.done_steps += 1
        if self.done_steps == self.steps:
            return StepResult("", reward, done=True)
        addend = self.addends[self.done_steps - 1]
        self.expected = answer + addend
        return StepResult(f"{answer}+{addend}=", reward)
