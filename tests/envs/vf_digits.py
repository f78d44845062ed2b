"""A two-turn `verifiers` environment (v1 API) for rlcore's tests: the model is asked for a number;
a reply that is not a short number is told so and gets one more turn, the environment's. Each
reply scores its share of digits times (1 + its brevity) / 2 (brevity: 1 for an empty reply, 0 from
24 characters on), so only digits earn anything; the reward is the first reply's score counted
twice and the second's once, over three: a signal a scratch model learns on CPU.

    workflow_args: {env: tests.envs.vf_digits, env_args: {num_tasks: 64}}
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

__all__ = ["DigitsTaskset", "DigitsEnv"]


def digit_share(text: str) -> float:
    text = text.strip()
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def score(reply: str) -> float:
    """Digits, and short: an empty reply scores 0, a 2-digit number 0.96."""
    return digit_share(reply) * (1.0 + max(0.0, 1.0 - len(reply.strip()) / 24)) / 2


class DigitsData(vf.TaskData):
    number: int = 0


class DigitsTask(vf.Task[DigitsData]):
    @vf.reward
    async def digits(self, task, trace) -> float:
        replies = [m.content or "" for m in trace.messages if isinstance(m, vf.AssistantMessage)]
        if not replies:
            return 0.0
        scores = [score(r) for r in replies[:2]]
        return (2 * scores[0] + (scores[1] if len(scores) > 1 else scores[0])) / 3


class DigitsTasksetConfig(vf.TasksetConfig):
    num_tasks: int = 64
    seed: int = 0


class DigitsTaskset(vf.Taskset[DigitsTask, DigitsTasksetConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.num_tasks):
            n = rng.randint(10, 99)
            yield DigitsTask(DigitsData(prompt=f"Say {n}.", number=n))


class DigitsEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class DigitsEnv(vf.Env[DigitsEnvConfig]):
    """The environment plays the user: one more turn after a reply that is not a short number."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            first = await chat.turn()
            if not first.terminated and score(first.last_reply) < 0.9:
                await chat.turn("Just the number, please.")
