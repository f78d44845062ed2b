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

Normalisation: DAPO's equation takes the token mean within each question's group,
1/sum_i |o_i| sum_i sum_t, then the mean over questions; the dapo preset (token-mean), as verl's and
the paper's released code, takes one token mean over the whole train batch, so a question whose
responses are long weighs more than in the equation.

Plain Python (no torch): the loop, which may run without a model, calls `dynamic_sampling`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("rlcore.dapo")


def informative_groups(rewards: Sequence[float], group_ids: Sequence[str]) -> list[str]:
    """The groups, in order of first appearance, whose rewards are not all equal."""
    seen: dict[str, set[float]] = {}
    for r, g in zip(rewards, group_ids, strict=True):
        seen.setdefault(g, set()).add(r)
    return [g for g, values in seen.items() if len(values) > 1]


def dynamic_sampling(
    exps: list[Any],
    want: int,
    max_rounds: int,
    explore_round: Callable[[int], list[Any]],
    metrics: dict[str, float],
) -> list[Any]:
    """Keep the step's experiences (anything with .reward and .group_id) whose groups are
    informative, and explore extra rounds (`explore_round(round)`, rounds 1, 2, ...) until `want`
    groups are kept or `max_rounds` ran; counts the rounds and the groups kept and dropped in `metrics`."""
    keep = set(informative_groups([e.reward for e in exps], [e.group_id for e in exps]))
    kept = [e for e in exps if e.group_id in keep]
    rounds, explored = 0, len(dict.fromkeys(e.group_id for e in exps))
    while len(keep) < want and rounds < max_rounds:
        rounds += 1
        more = explore_round(rounds)
        for e in more:  # a task may come back in another round: each round's groups are its own
            e.group_id = f"{e.group_id}@{rounds}"
        explored += len(dict.fromkeys(e.group_id for e in more))
        new = informative_groups([e.reward for e in more], [e.group_id for e in more])
        keep.update(new[: want - len(keep)])
        kept += [e for e in more if e.group_id in keep]
    metrics["rollout/dynamic_sampling_rounds"] = float(rounds)
    metrics["rollout/groups_kept"] = float(len(keep))
    metrics["rollout/groups_dropped"] = float(explored - len(keep))
    if len(keep) < want:
        log.info(
            "dynamic sampling: %d of %d groups after %d extra round(s) (the rest got equal rewards)",
            len(keep), want, rounds,
        )  # fmt: skip
    return kept


def truncated(finish_reason: str) -> bool:
    """Whether the token budget ended the response (it did not finish)."""
    return finish_reason == "length"


def overlong_penalty(length: int, max_tokens: int, buffer_len: int, factor: float) -> float:
    """The soft overlong punishment of a response of `length` tokens (<= 0; 0 with buffer_len 0)."""
    if buffer_len <= 0:
        return 0.0
    excess = length - (max_tokens - buffer_len)
    return -factor * min(max(excess, 0), buffer_len) / buffer_len
