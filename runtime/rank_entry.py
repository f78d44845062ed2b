"""The one body of a trainer rank, under `rlcore launch` (trainer_rank.py) and `rlcore trainer
serve` (trainer_serve.py): logging, threads, the world and its command channel; rank 0 leads (runs
the loop, or serves TrainerService) and commands the others, which follow until it shuts them down.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import torch

from ..core.config import RLCoreConfig
from . import rank_logs
from .lifecycle import die_with_parent
from .trainer_world import SenderFactory, TrainerWorld, command_group, follow, init_world


def run_rank(
    rank: int, device: str, lead: Callable[[Any], int], *, log_level: str | int, threads: int | None,
    collective_timeout_s: float | None, keep_serving: bool, parent_signal: int = signal.SIGKILL,
    joined: Callable[[], None] = lambda: None,
) -> int:  # fmt: skip
    """This rank's part of the world: rank 0 runs `lead(commands)` (the command channel), the others
    follow its commands (`keep_serving`: a failed command is logged and the next awaited, as a
    service must; else it ends the rank). The rank dies with torchrun's agent by `parent_signal`;
    `joined()` is called once the world has formed (every node's ranks met)."""
    die_with_parent(parent_signal)
    rank_logs.configure(rank, log_level)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads:
        torch.set_num_threads(threads)
    init_world(device, collective_timeout_s)
    joined()
    commands = command_group(collective_timeout_s if rank == 0 else None)
    try:
        if rank == 0:
            return lead(commands)
        world = TrainerWorld(device)
        try:
            follow(world, commands, keep_serving)
        finally:
            world.close_stage()
        return 0
    finally:
        torch.distributed.destroy_process_group()


def sender_factory(options: Callable[[RLCoreConfig], Any], device: str, master_address: str) -> SenderFactory:
    """Rank 0's way to reach rollout workers (weights.sender.connect): the client options a stage's
    config gets (`options`), joining the weight-sync group at `master_address`."""

    def make(endpoints: list[str], cfg: RLCoreConfig, token: str = "") -> Any:
        """`token`: the workers' own (another launch's), else the run's."""
        from dataclasses import replace

        from ..weights.sender import connect

        opts = options(cfg)
        return connect(endpoints, cfg.synchronizer, replace(opts, token=token) if token else opts, device, master_address)

    return make
