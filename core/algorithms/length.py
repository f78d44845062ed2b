"""Length shaping: a reward term that makes a response shorter than its group's others worth more, so
that a policy learns to answer in fewer tokens (algorithm.length_penalty).

Kimi k1.5's length reward (Kimi Team 2025, "Kimi k1.5: Scaling Reinforcement Learning with LLMs",
arXiv:2501.12599, section 2.3.3): among the responses to one task, of lengths n_i from n_min to n_max,

    lambda_i = 0.5 - (n_i - n_min) / (n_max - n_min)            (0 when all have one length)

in [-0.5, 0.5], the shortest +0.5 and the longest -0.5, is added to the reward weighted by `coef`:

- kind group (the paper's rule): a correct response gains coef * lambda_i, a wrong one
  coef * min(0, lambda_i): a wrong answer never gains by being short, and loses by being long;
- kind correct: only correct responses are shaped, lambda taken over the group's correct responses
  alone; a wrong one keeps its reward (the answer's correctness stays the only signal there).

A response is correct when its reward (before shaping) is at least `correct_reward`. The length is the
model's own tokens of the response (Experience.model_tokens: a tool's or the environment's tokens
in a multi-turn episode do not count).
"""

from __future__ import annotations

from collections.abc import Sequence


def length_rewards(
    lengths: Sequence[int],
    rewards: Sequence[float],
    group_ids: Sequence[str],
    kind: str,
    coef: float,
    correct_reward: float,
) -> list[float]:
    """Each response's length term (added to its reward), by `kind` (group or correct, above)."""
    correct = [r >= correct_reward for r in rewards]
    members: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        if kind == "group" or correct[i]:
            members.setdefault(g, []).append(i)
    out = [0.0] * len(lengths)
    for rows in members.values():
        shortest, longest = min(lengths[i] for i in rows), max(lengths[i] for i in rows)
        if longest == shortest:
            continue  # one length: nothing to prefer
        for i in rows:
            lam = 0.5 - (lengths[i] - shortest) / (longest - shortest)
            out[i] = coef * (lam if correct[i] else min(0.0, lam))
    return out
