"""Device choice and metric reduction shared by the strategies."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank_device(device: str) -> torch.device:
    """This rank's device: the GPU torchrun assigned it (LOCAL_RANK) for "cuda", else the CPU."""
    if device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def all_reduce_sum(
    values: dict[str, float], device: torch.device, group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """Sum float metrics over the ranks of `group` in one collective (keys must match on every rank)."""
    if not values:
        return {}
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    return dict(zip(keys, t.tolist(), strict=True))
