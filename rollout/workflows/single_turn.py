"""One prompt, one response, one score: the workflow behind math/QA-style GRPO."""

from __future__ import annotations

import time

from ...core.types import Experience, SamplingParams, Task
from .base import Workflow


class SingleTurnWorkflow(Workflow):
    """Encode each task's prompt, sample `sampling.n` responses in one engine call and score them
    (all at once: a batch reward function sees the whole call's completions)."""

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        """Experiences task by task, then sample by sample; a task's samples share its task_id as group."""
        prompts = [self.encode_prompt(task) for task in tasks]
        start = time.perf_counter()
        completions = self.engine.generate(prompts, sampling)
        generated = time.perf_counter()
        pairs = [(task, c) for task, samples in zip(tasks, completions, strict=True) for c in samples]
        scored = self.reward.score_batch([c.text for _, c in pairs], [task for task, _ in pairs])
        experiences = [
            Experience(
                prompt_token_ids=c.prompt_token_ids, response_token_ids=c.token_ids, logprobs=c.logprobs,
                reward=reward, group_id=task.task_id, policy_version=policy_version, finish_reason=c.finish_reason,
                response_text=c.text, reward_components=components, segments=c.segments,
                routed_experts=c.routed_experts,
            )
            for (task, c), (reward, components) in zip(pairs, scored, strict=True)
        ]  # fmt: skip
        self.timing = {"engine_s": generated - start, "reward_s": time.perf_counter() - generated}
        return experiences
