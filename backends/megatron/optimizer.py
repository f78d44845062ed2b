"""megatron-core's optimizer as the megatron strategy steps and checkpoints it: gradient clipping
that also covers a MoE model's ChainedOptimizer, the AdamW state that torch's optimizer keeps
where megatron-core's checkpoints do not look, and the distributed optimizer's gradient slices
gathered whole."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core.distributed.param_and_grad_buffer import shard_buffer
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32


def clip_grad_norm(optimizer: Any, max_norm: float) -> float:
    """The norm of every gradient (pre-clip), each scaled to `max_norm` if above it. A MoE model's
    optimizer is a ChainedOptimizer (the dense and the expert parameters, reduced over different
    groups), which megatron-core clips only in its own `step`: the total norm over both parts here,
    then each part clipped by it (what a single optimizer's clip_grad_norm does)."""
    if not hasattr(optimizer, "chained_optimizers"):
        return float(optimizer.clip_grad_norm(max_norm))
    grad_norm = float(optimizer.get_grad_norm())
    for part in optimizer.chained_optimizers:
        params = part.get_parameters()
        if params:
            clip_grad_by_total_norm_fp32(
                params, max_norm, grad_norm, part.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8
            )
    return grad_norm


def inner_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside megatron-core's (one per part of a ChainedOptimizer)."""
    return [opt.optimizer for opt in getattr(optimizer, "chained_optimizers", [optimizer])]


def restore_adam_steps(optimizer: Any) -> None:
    """megatron-core (torch-optimizer path) keeps Adam's step count in each param group of the
    checkpoint but leaves the per-parameter `step` torch's AdamW reads untouched: copy it there,
    one tensor per parameter (AdamW increments them in place)."""
    for inner in inner_optimizers(optimizer):
        for group in inner.param_groups:
            if "step" in group:
                for p in group["params"]:
                    inner.state[p]["step"] = torch.tensor(float(group["step"]))


def materialize_optimizer_state(optimizer: Any) -> None:
    """torch's AdamW creates its state on the first step, but megatron-core (without Apex or
    TransformerEngine) describes the state to load from the state it already has: give a fresh
    optimizer zero state, as its first step would, so that the checkpoint can fill it."""
    for inner in inner_optimizers(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                state = inner.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def gather_grad_shards(ddp_model: Any) -> None:
    """With the distributed optimizer, after the reduce-scatter each DP rank of `ddp_model` (megatron's
    DistributedDataParallel) holds only its slice of the summed gradients: all-gather the slices so
    every rank has them whole (the optimizer reads only its own). The experts' buckets are reduced
    over the expert-data-parallel group, the rest over the data-parallel group: each bucket group
    says which."""
    for bucket_group in ddp_model.bucket_groups + ddp_model.expert_parallel_bucket_groups:
        group = bucket_group.intra_distributed_optimizer_instance_group
        for bucket in bucket_group.buckets:
            shards = shard_buffer(bucket.grad_data, group.size())
            dist.all_gather_into_tensor(bucket.grad_data, shards[group.rank()].clone(), group=group)
