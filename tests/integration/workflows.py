"""User workflows named by import path in tests (`default_workflow_type: tests.integration.workflows:...`)."""

from __future__ import annotations

from typing import Any

from rlcore.core.types import Experience, SamplingParams, Task
from rlcore.rollout.workflows.single_turn import SingleTurnWorkflow


class BonusWorkflow(SingleTurnWorkflow):
    """single_turn, plus `workflow_args.bonus` added to every reward: a workflow that reads its args."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        bonus = self.args.get("bonus")
        if not isinstance(bonus, (int, float)) or isinstance(bonus, bool):
            raise ValueError(f"workflow_args.bonus must be a number; got {bonus!r}")
        self.bonus = float(bonus)

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        experiences = super().run(tasks, sampling, policy_version)
        for e in experiences:
            e.reward += self.bonus
            e.reward_components["bonus"] = self.bonus
        return experiences
