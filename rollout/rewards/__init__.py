"""Reward functions: registered names resolve lazily to `fn(response: str, task: Task) -> float`."""

from ...core.registry import Registry

REWARDS = Registry(
    "reward_fn",
    {
        "exact_match": "rlcore.rollout.rewards.answer:exact_match",
        "numeric": "rlcore.rollout.rewards.answer:numeric_match",
        "format": "rlcore.rollout.rewards.answer:format_reward",
        "math": "rlcore.rollout.rewards.latex_math:math_verify",
        "judge": "rlcore.rollout.rewards.judge:Judge",  # built from the taskset's judge block
        "reward_model": "rlcore.rollout.rewards.reward_model:RewardModelScorer",  # from its reward_model block
    },
)
