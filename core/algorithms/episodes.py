"""Advantages when an episode gave several samples (Experience.episode_id).

A multi-turn conversation whose chat template renders its history differently once a new turn
follows (a thinking template drops the reasoning of earlier turns after a new user turn) goes on as
a new sample, and an agent's episode through the door may hold several conversations: one episode,
several experiences, one reward. Counting each sample in its group's statistics would weigh an
episode by how often it was split, so a response-level advantage (grpo, rloo, opmd, ...) is
computed on one row per episode and given to each of its samples, as tinker-cookbook and prime-rl
give a trajectory's advantage to each of its pieces. A per-token advantage (gae,
reinforce_plus_plus) has one value per token of each sample: it is computed on the samples
themselves, each one a sequence of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import torch

from .scored import ScoredBatch


def episode_rows(episode_ids: Sequence[str]) -> tuple[list[int], list[int]]:
    """(the first row of each episode, each row's episode index); an empty id is an episode of its own."""
    position: dict[str, int] = {}
    first: list[int] = []
    index: list[int] = []
    for i, eid in enumerate(episode_ids):
        key = eid or f"\x00row{i}"
        if key not in position:
            position[key] = len(first)
            first.append(i)
        index.append(position[key])
    return first, index


def select(batch: ScoredBatch, rows: list[int]) -> ScoredBatch:
    """`batch`'s rows `rows` (every per-response and per-token field)."""
    picked = torch.tensor(rows, dtype=torch.long)
    tensors = {
        f.name: getattr(batch, f.name)[picked]
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, group_ids=[batch.group_ids[i] for i in rows], episode_ids=None, **tensors)


def per_episode(fn: Callable[[ScoredBatch], torch.Tensor], batch: ScoredBatch) -> torch.Tensor:
    """`fn`'s advantages of `batch` with each episode counted once (module docstring)."""
    if batch.episode_ids is None:
        return fn(batch)
    rows, index = episode_rows(batch.episode_ids)
    if len(rows) == len(index):  # every sample a whole episode
        return fn(batch)
    adv = fn(select(batch, rows))
    if adv.dim() == 1:
        return adv[torch.tensor(index, dtype=torch.long)]
    return fn(batch)
