"""User workflows named by import path in tests (`default_workflow_type: tests.integration.workflows:...`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlcore.core.types import Experience, SamplingParams, Task
from rlcore.rollout.workflows.base import Workflow
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


class FailsOnceWorkflow(SingleTurnWorkflow):
    """single_turn, except that its `workflow_args.at_call`-th run (counted in this worker process)
    raises, once per run: `workflow_args.marker` (a file it creates) says it already failed. A fault
    the explorer cannot retry (the worker answers INVALID_ARGUMENT), injected into a real run."""

    calls = 0

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        import os

        FailsOnceWorkflow.calls += 1
        marker = str(self.args["marker"])
        if FailsOnceWorkflow.calls >= int(self.args["at_call"]) and not os.path.exists(marker):
            open(marker, "w").close()
            raise ValueError("injected failure (tests.integration.workflows:FailsOnceWorkflow)")
        return super().run(tasks, sampling, policy_version)


class TwoTurnWorkflow(Workflow):
    """A conversation of two model turns around an environment turn: the model answers, the
    environment replies `workflow_args.reply` (its tokens stay in the sequence, out of the loss), the
    model answers again. One experience per conversation, its tokens exactly as generated and
    inserted, scored on the last answer. `workflow_args.mask_context: false` leaves the reply in the
    loss (what a workflow without a loss mask would train on)."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.reply = list(self.tokenizer.encode(self.args.get("reply", "+0="), add_special_tokens=False))
        self.mask_context = bool(self.args.get("mask_context", True))

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        per_turn = max(1, sampling.max_tokens // 2)
        prompts = [self.encode_prompt(t) for t in tasks]
        first = self.engine.generate(prompts, replace(sampling, max_tokens=per_turn))
        turns = [(task, c) for task, samples in zip(tasks, first, strict=True) for c in samples]
        followups = [c.prompt_token_ids + c.token_ids + self.reply for _, c in turns]
        second = self.engine.generate(followups, replace(sampling, n=1, max_tokens=per_turn))
        experiences = []
        for (task, c1), (c2,) in zip(turns, second, strict=True):
            reward, components = self.reward(c2.text, task)
            mask = [1] * len(c1.token_ids) + [0] * len(self.reply) + [1] * len(c2.token_ids)
            experiences.append(
                Experience(
                    prompt_token_ids=c1.prompt_token_ids,
                    response_token_ids=c1.token_ids + self.reply + c2.token_ids,
                    logprobs=c1.logprobs + [0.0] * len(self.reply) + c2.logprobs,
                    reward=reward,
                    group_id=task.task_id,
                    policy_version=policy_version,
                    finish_reason=c2.finish_reason,
                    response_text=c2.text,
                    reward_components=components,
                    loss_mask=mask if self.mask_context else [],
                )  # fmt: skip
            )
        return experiences
