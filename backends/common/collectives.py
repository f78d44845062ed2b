"""All-gathers that carry gradients, for the ranks that split one sequence (Ulysses, context
parallelism), on NCCL and on gloo alike; and a flag agreed by every rank (`on_ranks`).

torch.distributed.nn.functional.all_gather's backward on gloo emulates a reduce-scatter with
scatters whose source is the rank's place in the group where the global rank is expected, so it
fails in any group that does not start at global rank 0 (the second of two sequence-parallel
groups). These use one all_to_all_single instead, which every backend has.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def on_ranks(flag: bool, every: bool) -> bool:
    """Whether `flag` holds on every rank of the default group (`every`), or on any."""
    device = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
    box = torch.tensor([int(flag)], device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MIN if every else dist.ReduceOp.MAX)
    return bool(box.item())


def all_gather_summed(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[size, ...] every rank's `local` [...], in rank order. Each rank computes something of its
    own from the result, so the backward sums the ranks' gradients of each part (a reduce-scatter)."""
    return _AllGather.apply(local, group, True)


def all_gather_replicated(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[size, ...] as `all_gather_summed`, for results every rank computes the same function of (a
    loss): the backward keeps this rank's own part of its gradient, with no communication."""
    return _AllGather.apply(local, group, False)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup, summed: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.group, ctx.summed = group, summed
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        if not ctx.summed:
            return grad[dist.get_rank(ctx.group)], None, None
        got = torch.empty_like(grad)  # got[r]: rank r's gradient of this rank's part
        dist.all_to_all_single(got, grad.contiguous(), group=ctx.group)
        return got.sum(0), None, None
