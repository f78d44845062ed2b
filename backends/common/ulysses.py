"""Ulysses sequence parallelism for the HF models of the native strategies (fsdp, fsdp2).

`trainer.ulysses_sequence_parallel_size` S > 1 groups the trainer ranks S at a time: a group shares
one data-parallel share of the batch, and each micro-batch's packed row (packed.py) is cut into S
equal slices, one per rank, so a sequence S times longer than one rank's budget trains. Everything
in a decoder block but attention works token by token on the rank's slice; attention
(`ulysses_attention`, registered with HF as ATTENTION) trades the slices for heads with an
all-to-all, so each rank attends over the whole row for H / S heads, causal within each packed
sequence, and trades back (Jacobs et al. 2023, DeepSpeed-Ulysses, arXiv:2309.14509).

Each rank computes the log-probs (values) of its slice's next tokens; an all-gather that carries
gradients gives every rank of the group the whole row's, so the loss is computed as without
sequence parallelism, S times. The all-gather's backward sums the S copies' gradients, and the
strategy scales the loss by the data-parallel size instead of the world size (FSDP averages over all
ranks), so each parameter's gradient is the one the whole share gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F

ATTENTION = "rlcore_ulysses"
"""The attention implementation's name in HF's AttentionInterface."""


@dataclass
class SequenceParallel:
    """This rank's sequence-parallel group: `size` ranks, this one at `rank` in it."""

    group: dist.ProcessGroup
    rank: int
    size: int

    @classmethod
    def build(cls, size: int) -> tuple[SequenceParallel, dist.ProcessGroup]:
        """Groups of `size` consecutive ranks (collective: every rank builds every group), and this
        rank's data-parallel group: the ranks at its own place in every group."""
        world, me = dist.get_world_size(), dist.get_rank()
        if world % size:
            raise ValueError(
                f"trainer.ulysses_sequence_parallel_size: {size} must divide the number of trainer ranks ({world})"
            )
        mine = dp = None
        for g in range(world // size):
            group = dist.new_group(list(range(g * size, (g + 1) * size)))
            if me // size == g:
                mine = group
        for place in range(size):
            group = dist.new_group(list(range(place, world, size)))
            if me % size == place:
                dp = group
        assert mine is not None and dp is not None
        return cls(mine, me % size, size), dp

    def slice_of(self, n: int) -> slice:
        """This rank's part of a row of n tokens (n a multiple of size)."""
        chunk = n // self.size
        return slice(self.rank * chunk, (self.rank + 1) * chunk)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The group's slices [chunk] of a row, in order, as one [size x chunk] (with gradients)."""
        return torch.cat(dist_fn.all_gather(local.contiguous(), group=self.group))


_active: list[tuple[SequenceParallel, list[int]]] = []
"""The group and the packed row's sequence offsets of the forward in progress (sequence_parallel)."""


@contextmanager
def sequence_parallel(sp: SequenceParallel, cu_seqlens: list[int]) -> Iterator[None]:
    """Within: ulysses_attention runs over `sp`, the whole row's sequences starting at cu_seqlens."""
    _active.append((sp, cu_seqlens))
    try:
        yield
    finally:
        _active.pop()


def _seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """[1, H, chunk, D] of this rank's slice -> [1, H / S, S x chunk, D]: the whole row, its heads."""
    _, h, chunk, d = x.shape
    send = x.reshape(sp.size, h // sp.size, chunk, d).contiguous()  # head groups, one per rank
    got = dist_fn.all_to_all_single(torch.empty_like(send), send, group=sp.group)  # one slice per rank
    return got.permute(1, 0, 2, 3).reshape(1, h // sp.size, sp.size * chunk, d)


def _heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """The inverse of _seq_to_heads: [1, H / S, S x chunk, D] -> [1, H, chunk, D]."""
    _, hs, n, d = x.shape
    send = x.reshape(hs, sp.size, n // sp.size, d).permute(1, 0, 2, 3).contiguous()  # slices, one per rank
    got = dist_fn.all_to_all_single(torch.empty_like(send), send, group=sp.group)  # head groups by rank
    return got.reshape(1, sp.size * hs, n // sp.size, d)


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """HF's attention-function interface: query [1, H, chunk, D], key and value [1, H_kv, chunk, D]
    of this rank's slice -> [1, chunk, H, D]. Causal attention within each packed sequence."""
    assert _active, "ulysses_attention outside sequence_parallel(): the strategy sets the row up"
    sp, cu = _active[-1]
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % sp.size:  # fewer KV heads than ranks: each rank takes the KV heads its queries read
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q, k, v = (_seq_to_heads(t, sp) for t in (query, key, value))
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    p = dropout if module.training else 0.0
    out = torch.cat(
        [
            F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], dropout_p=p, is_causal=True, scale=scaling)
            for a, b in zip(cu[:-1], cu[1:], strict=True)
            if b > a
        ],
        dim=2,
    )
    return _heads_to_seq(out, sp).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ATTENTION an HF attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)


def use_ulysses(model: torch.nn.Module, sp_size: int) -> None:
    """Switch an HF model (a peft model's base included) to ulysses_attention; its heads must split
    evenly over the group."""
    register()
    config: Any = model.config
    heads = config.num_attention_heads
    if heads % sp_size:
        raise ValueError(
            f"trainer.ulysses_sequence_parallel_size: {sp_size} must divide the model's {heads} attention heads"
        )
    config._attn_implementation = ATTENTION
