"""DAPO's shaping of what a GRPO step trains on (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", arXiv:2503.14476), besides its clip-higher and token-level
loss (the `dapo` preset's knobs):

- dynamic sampling: a group whose responses all got the same reward has advantage 0 everywhere and
  only shrinks the batch; such groups are dropped and fresh tasks explored until the step has its
  batch_size groups again (`informative_groups`; the loop runs the extra rounds);
- overlong filtering: a response the token budget cut off is no evidence of a bad answer, so it is
  left out of the loss (`truncated`);
- soft overlong punishment: with budget L and buffer B, a response of length n > L - B loses
  factor * (n - (L - B)) / B of reward, all of `factor` at the budget (`overlong_penalty`).

Plain Python (no torch): the loop, which may run without a model, calls `informative_groups`.
"""

from __future__ import annotations

from collections.abc import Sequence


def informative_groups(rewards: Sequence[float], group_ids: Sequence[str]) -> list[str]:
    """The groups, in order of first appearance, whose rewards are not all equal."""
    seen: dict[str, set[float]] = {}
    for r, g in zip(rewards, group_ids, strict=True):
        seen.setdefault(g, set()).add(r)
    return [g for g, values in seen.items() if len(values) > 1]


def truncated(finish_reason: str) -> bool:
    """Whether the token budget ended the response (it did not finish)."""
    return finish_reason == "length"


def overlong_penalty(length: int, max_tokens: int, buffer_len: int, factor: float) -> float:
    """The soft overlong punishment of a response of `length` tokens (<= 0; 0 with buffer_len 0)."""
    if buffer_len <= 0:
        return 0.0
    excess = length - (max_tokens - buffer_len)
    return -factor * min(max(excess, 0), buffer_len) / buffer_len
