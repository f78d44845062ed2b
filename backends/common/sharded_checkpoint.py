"""Sharded checkpoints through torch.distributed.checkpoint (DCP), for FSDP1 and FSDP2 alike:
every rank writes only its shards of the model and optimizer state, so no rank ever holds the full
optimizer state; rank 0 adds the lr schedule as `scheduler.pt`."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save_sharded(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """Collective: write model, optimizer and scheduler state under `path`."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    if dist.get_rank() == 0:
        torch.save({"scheduler": scheduler.state_dict()}, os.path.join(path, "scheduler.pt"))
    dist.barrier()


def load_sharded(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """Collective: restore what `save_sharded` wrote."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = torch.load(os.path.join(path, "scheduler.pt"), weights_only=True)
    scheduler.load_state_dict(extra["scheduler"])
