"""One prompt, one response, one score: the workflow behind math/QA-style GRPO."""

from __future__ import annotations

import time
from typing import Any

from ...core.types import Experience, SamplingParams, Task
from ..engines.base import RolloutEngine
from ..rewards.compose import RewardComposer
from .prompts import PromptFormat


class SingleTurnWorkflow:
    """Encode each task's prompt, sample `sampling.n` responses in one engine call and score them."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        reward: RewardComposer,
        *,
        max_prompt_tokens: int,
        apply_chat_template: bool = False,
        chat_template: str | None = None,
        system_prompt: str | None = None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.reward = reward
        self.prompt_format = PromptFormat(
            max_prompt_tokens, apply_chat_template, chat_template, system_prompt
        )
        self.timing: dict[str, float] = {}
        """Seconds the last batch spent in the engine (engine_s) and in reward functions (reward_s)."""

    def encode_prompt(self, task: Task) -> list[int]:
        return self.prompt_format.encode_prompt(self.tokenizer, task.prompt)

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        """Experiences task by task, then sample by sample; a task's samples share its task_id as group."""
        prompts = [self.encode_prompt(task) for task in tasks]
        start = time.perf_counter()
        completions = self.engine.generate(prompts, sampling)
        generated = time.perf_counter()
        experiences = []
        for task, samples in zip(tasks, completions, strict=True):
            for c in samples:
                reward, components = self.reward(c.text, task)
                experiences.append(
                    Experience(
                        prompt_token_ids=c.prompt_token_ids,
                        response_token_ids=c.token_ids,
                        logprobs=c.logprobs,
                        reward=reward,
                        group_id=task.task_id,
                        policy_version=policy_version,
                        finish_reason=c.finish_reason,
                        response_text=c.text,
                        reward_components=components,
                    )
                )
        self.timing = {"engine_s": generated - start, "reward_s": time.perf_counter() - generated}
        return experiences
