"""Which GPUs of this node the processes a launch starts may use.

On a CUDA node the trainer ranks torchrun starts here take the first `cluster.ranks_per_node` visible
GPUs (rank i on the i-th: torchrun's LOCAL_RANK indexes the list it is given), and each rollout worker
this launch starts takes the next `tensor_parallel_size` GPUs. Every process is handed its GPUs as
CUDA_VISIBLE_DEVICES, so a worker's `cuda:0` is its own GPU, never trainer rank 0's.

NCCL refuses two ranks of one group on the same GPU, and the weight-sync group holds trainer rank 0
and every engine worker: with sync_method nccl each of them needs a GPU of its own. Engines that load
weights from a checkpoint folder (sync_method checkpoint) join no group and may share GPUs with the
trainer, in turn from the first GPU after the trainer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..core.config import ConfigError


@dataclass(frozen=True)
class GpuPlacement:
    trainer: list[str]
    """CUDA_VISIBLE_DEVICES entries of the local trainer ranks (empty: no trainer on this node)."""
    engines: list[list[str]]
    """One list per rollout worker, as many entries as its tensor-parallel size."""
    shared: bool = False
    """Some GPU holds more than one process (only for engines that sync from checkpoints)."""


def visible_gpus(env: Mapping[str, str], device_count: int) -> list[str]:
    """The GPUs this launch may hand out: CUDA_VISIBLE_DEVICES' entries (indices or UUIDs) when it is
    set, else the indices of every device."""
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(device_count)]
    return [g.strip() for g in listed.split(",") if g.strip()]


def place_gpus(
    visible: list[str], trainer_ranks: int, engine_num: int, gpus_per_engine: int, may_share: bool
) -> GpuPlacement:
    """Trainer ranks first, then the engines in order; a one-line ConfigError when they do not fit."""
    shown = f"this node shows {len(visible)} GPU(s)" + (f" ({','.join(visible)})" if visible else "")
    if trainer_ranks > len(visible):
        raise ConfigError(
            f"cluster.ranks_per_node {trainer_ranks} needs one GPU per trainer rank; {shown}: lower "
            "cluster.ranks_per_node or set CUDA_VISIBLE_DEVICES to more GPUs"
        )
    if gpus_per_engine > len(visible):
        raise ConfigError(
            f"explorer.rollout_model.tensor_parallel_size {gpus_per_engine} needs that many GPUs per engine; "
            f"{shown}: lower tensor_parallel_size"
        )
    trainer, free = visible[:trainer_ranks], visible[trainer_ranks:]
    needed = engine_num * gpus_per_engine
    if needed <= len(free):
        engines = [free[i * gpus_per_engine : (i + 1) * gpus_per_engine] for i in range(engine_num)]
        return GpuPlacement(trainer, engines)
    if not may_share:
        raise ConfigError(
            f"{trainer_ranks} trainer rank(s) (cluster.ranks_per_node) and {engine_num} rollout worker(s) of "
            f"{gpus_per_engine} GPU(s) (explorer.rollout_model.engine_num x tensor_parallel_size) need "
            f"{trainer_ranks + needed} GPUs and NCCL weight sync cannot share one; {shown}: lower them, use "
            "mode colocate (the engine inside trainer rank 0), or synchronizer.sync_method checkpoint "
            "(engines then share GPUs; lower explorer.rollout_model.gpu_memory_utilization to fit)"
        )
    # sharing: engines in turn over the GPUs, starting after the trainer's (each engine's GPUs distinct)
    order = free + trainer
    engines = [
        [order[(i * gpus_per_engine + j) % len(order)] for j in range(gpus_per_engine)]
        for i in range(engine_num)
    ]
    return GpuPlacement(trainer, engines, shared=True)
