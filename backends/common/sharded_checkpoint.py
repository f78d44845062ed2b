"""Sharded checkpoints through torch.distributed.checkpoint (DCP), for FSDP1 and FSDP2 alike:
every rank writes only its shards of the model and optimizer state, so no rank ever holds the full
optimizer state; rank 0 adds the lr schedule (and float16's loss scale) as `scheduler.pt`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from .collectives import on_ranks

UNSTEPPED = "unstepped"
"""An optimizer that never stepped has no state, and torch's get_state_dict makes some by a step on
zero gradients, which counts in Adam's step (its bias correction): the optimizer's next step would be
its second. A save of such an optimizer leaves it without state again and says so (`scheduler.pt`'s
"unstepped"), and a load of that save leaves it without state, so that a checkpoint taken before the
first step (a Tinker model giving up the trainer at once) changes nothing that follows."""
REFERENCE_DIR = "reference"
"""A checkpoint's sub-folder for the reference model, when it moves (algorithm.sync_ref_model)."""


def save_sharded(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: ShardedGradScaler | None = None,
    keep: Callable[[str], bool] | None = None,
) -> None:
    """Collective: write model, optimizer, scheduler (and loss scaler) state under `path`; `keep`:
    only the model entries it accepts (LoRA's adapter, not the frozen base)."""
    unstepped = on_ranks(not optimizer.state, every=True)  # a rank whose shard trains nothing has no state
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": _kept(model_sd, keep), "optim": optim_sd}, checkpoint_id=path)
    if unstepped:
        optimizer.state.clear()  # UNSTEPPED: the optimizer as it was
    if dist.get_rank() == 0:
        extra = {"scheduler": scheduler.state_dict(), UNSTEPPED: unstepped}
        if scaler is not None:
            extra["scaler"] = scaler.state_dict()
        torch.save(extra, os.path.join(path, "scheduler.pt"))
    dist.barrier()


def load_sharded(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: ShardedGradScaler | None = None,
    keep: Callable[[str], bool] | None = None,
) -> None:
    """Collective: restore what `save_sharded` wrote (a loss scaler only if one was saved; with
    `keep`, the entries it accepts: the others keep their values)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": _kept(model_sd, keep), "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)  # in place: the kept entries are model_sd's own tensors
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=state["optim"])
    extra = torch.load(os.path.join(path, "scheduler.pt"), weights_only=True)
    if extra.get(UNSTEPPED):
        optimizer.state.clear()  # UNSTEPPED
    scheduler.load_state_dict(extra["scheduler"])
    if scaler is not None and "scaler" in extra:
        scaler.load_state_dict(extra["scaler"])


def _kept(state: dict[str, Any], keep: Callable[[str], bool] | None) -> dict[str, Any]:
    # (StateDictOptions(ignore_frozen_params=True) would do it, but FSDP1's state-dict hooks refuse it)
    return state if keep is None else {k: v for k, v in state.items() if keep(k)}


def save_module(path: str, module: torch.nn.Module) -> None:
    """Collective: a module's weights alone (the reference model), each rank writing its shards."""
    dcp.save({"model": get_model_state_dict(module)}, checkpoint_id=path)


def load_module(path: str, module: torch.nn.Module) -> None:
    """Collective: restore what `save_module` wrote."""
    state = {"model": get_model_state_dict(module)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(module, state["model"])
