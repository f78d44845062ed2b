"""Advantages when an episode gave several samples (Experience.episode_id).

A multi-turn conversation whose chat template renders its history differently once a new turn
follows (a thinking template drops the reasoning of earlier turns after a new user turn) goes on as
a new sample, and an agent's episode through the door may hold several conversations: one episode,
several experiences, one reward. Counting each sample in its group's statistics would weigh an
episode by how often it was split, so a response-level advantage (grpo, rloo, opmd, ...) is
computed on one row per episode (its last sample's, with the KL penalties of all its samples in its
reward) and given to each of its samples, as tinker-cookbook and prime-rl give a trajectory's
advantage to each of its pieces. A per-token advantage (gae,
reinforce_plus_plus) has one value per token of each sample: it is computed on the samples
themselves, each one a sequence of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import torch

from ..types import episode_key
from .scored import ScoredBatch


def episode_rows(episode_ids: Sequence[str], group_ids: Sequence[str]) -> tuple[list[int], list[int]]:
    """(the last row of each episode, each row's episode index); an empty id is an episode of its own,
    and an id names an episode within its group."""
    position: dict[tuple[str, str] | int, int] = {}
    last: list[int] = []
    index: list[int] = []
    for i, (eid, gid) in enumerate(zip(episode_ids, group_ids, strict=True)):
        key = episode_key(gid, eid, i)
        if key not in position:
            position[key] = len(last)
            last.append(i)
        last[position[key]] = i
        index.append(position[key])
    return last, index


def select(batch: ScoredBatch, rows: list[int]) -> ScoredBatch:
    """`batch`'s rows `rows` (every per-response and per-token field)."""
    picked = torch.tensor(rows, dtype=torch.long)
    tensors = {
        f.name: getattr(batch, f.name)[picked]
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, group_ids=[batch.group_ids[i] for i in rows], episode_ids=None, **tensors)


def episodes_of(batch: ScoredBatch, last: list[int], index: list[int]) -> ScoredBatch:
    """One row per episode: its last sample's (the episode's end: its score, its truncation), with the
    KL penalty in the reward (use_kl_in_reward) of every sample of the episode, summed."""
    episodes = select(batch, last)
    if batch.scores is not None:
        penalty_N = (batch.scores - batch.rewards).double()
        summed_E = penalty_N.new_zeros(len(last)).index_add_(0, torch.tensor(index), penalty_N)
        last_scores = batch.scores[torch.tensor(last, dtype=torch.long)].double()
        episodes.rewards = (last_scores - summed_E).to(batch.rewards.dtype)
    return episodes


def per_episode(fn: Callable[[ScoredBatch], torch.Tensor], batch: ScoredBatch) -> torch.Tensor:
    """`fn`'s advantages of `batch` with each episode counted once (module docstring)."""
    if batch.episode_ids is None:
        return fn(batch)
    last, index = episode_rows(batch.episode_ids, batch.group_ids)
    if len(last) == len(index):  # every sample a whole episode
        return fn(batch)
    adv = fn(episodes_of(batch, last, index))
    if adv.dim() == 1:
        return adv[torch.tensor(index, dtype=torch.long)]
    return fn(batch)
