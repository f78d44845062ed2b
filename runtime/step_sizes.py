"""How a stage's steps are sized: the experiences one explore step hands the trainer, its
mini-batches (one optimizer step each), the stage's explore and optimizer steps, and the longest
response (Dr. GRPO's divisor). The trainer, the loop and the Tinker trainer read them here."""

from __future__ import annotations

import math

from ..core.algorithms import trains_on
from ..core.config import RLCoreConfig


def max_response_len(cfg: RLCoreConfig) -> int:
    """The longest response any training taskset (a mixture's too) samples: Dr. GRPO's divisor."""
    ts = cfg.buffer.explorer_input.taskset
    return max(
        t.rollout_args.max_tokens or cfg.model.max_response_tokens
        for t in [ts, *cfg.buffer.explorer_input.mixture]
    )


def experiences_per_step(cfg: RLCoreConfig) -> int:
    """What one explore step hands the trainer: batch_size tasks x repeat_times rollouts, or without
    rollouts batch_size taskset rows."""
    explores = trains_on(cfg.algorithm) == "rollouts"
    return cfg.buffer.batch_size * (cfg.algorithm.repeat_times if explores else 1)


def mini_batches(num_rows: int, cfg: RLCoreConfig, starts: list[int] | None = None) -> list[range]:
    """The rows of each of a step's mini-batches: train_batch_size rows each, the last one short
    when rows are missing (stale ones dropped), never more than the planned updates per step. More
    rows than planned (split episodes, Experience.episode_id; `starts`: each episode's first row):
    equal shares, each cut at an episode's start so that no episode spans two updates."""
    train_batch = plan_steps(cfg, cfg.buffer.batch_size)[0]
    count = min(-(-num_rows // train_batch), max(experiences_per_step(cfg) // train_batch, 1))
    if starts is None or num_rows <= count * train_batch:
        return [
            range(i * train_batch, num_rows if i == count - 1 else (i + 1) * train_batch) for i in range(count)
        ]
    cuts = [0]
    for k in range(1, count):
        cut = next((s for s in starts if s >= k * num_rows / count), num_rows)
        if cuts[-1] < cut < num_rows:
            cuts.append(cut)
    return [range(a, b) for a, b in zip(cuts, [*cuts[1:], num_rows], strict=True)]


def plan_steps(cfg: RLCoreConfig, num_tasks: int) -> tuple[int, int, int]:
    """(experiences per optimizer step, explore steps, optimizer steps) of a stage."""
    per_step = experiences_per_step(cfg)
    train_batch = cfg.buffer.train_batch_size or per_step
    updates_per_step = per_step // train_batch
    explore_steps = (num_tasks // cfg.buffer.batch_size) * cfg.buffer.total_epochs
    if cfg.buffer.total_steps is not None:
        explore_steps = min(explore_steps, cfg.buffer.total_steps)
    train_steps = explore_steps * updates_per_step
    if cfg.trainer.total_steps is not None:
        train_steps = min(train_steps, cfg.trainer.total_steps)
    return train_batch, math.ceil(train_steps / updates_per_step), train_steps
