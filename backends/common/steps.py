"""The parts of a training step that FSDP1 and FSDP2 run identically: gradient accumulation over
micro-batches, the optimizer step after clipping, log-prob passes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from ..base import Batch, LossFn
from .hf_model import forward_logprobs


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def accumulate_gradients(
    model: torch.nn.Module,
    micro_batches: list[Batch],
    loss_fn: LossFn,
    temperature: float,
    device: torch.device,
    loss_scale: float,
    gradient_sync: Callable[[bool], AbstractContextManager],
) -> dict[str, float]:
    """Forward + backward every micro-batch; return this rank's metrics summed over micro-batches.

    `gradient_sync(is_last)` wraps each micro-batch so the strategy can reduce gradients across ranks
    only once, after the last one. Each loss is multiplied by `loss_scale` before backward: FSDP
    averages gradients over ranks while the loss is already this rank's share of the global mean, so
    scaling by the world size turns the average back into the sum.
    """
    model.train()
    totals: dict[str, float] = defaultdict(float)
    for i, mb in enumerate(micro_batches):
        mb = to_device(mb, device)
        with gradient_sync(i == len(micro_batches) - 1):
            logprobs, entropy = forward_logprobs(model, mb, temperature, loss_fn.needs_entropy)
            loss, metrics = loss_fn(logprobs, entropy, mb)
            (loss * loss_scale).backward()
        for k, v in metrics.items():
            totals[k] += v
    return dict(totals)


def step_if_finite(
    grad_norm: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> float:
    """After clipping: step the optimizer unless the norm is inf/nan (a bad batch must not poison the
    weights), then zero the gradients and advance the lr schedule either way."""
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return float(grad_norm)


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module, micro_batches: list[Batch], temperature: float, device: torch.device
) -> list[torch.Tensor]:
    """Per-token log-probs [B, T] of each micro-batch, float32 on the CPU."""
    out = []
    for mb in micro_batches:
        logprobs, _ = forward_logprobs(model, to_device(mb, device), temperature, with_entropy=False)
        out.append(logprobs.float().cpu())
    return out
