"""Context parallelism on megatron-core: one packed row split over C ranks.

`trainer.megatron.context_parallel_size` C > 1 gives every rank of a context-parallel group the
same data-parallel share and a 1/C part of each micro-batch's packed row (packing.py), so a
sequence C times longer than one rank's budget trains. Each sequence is padded to a multiple of 2C
and cut into 2C equal chunks; rank r holds chunks r and 2C-1-r, so that under a causal mask every
rank does the same attention work (the load-balanced layout of megatron-core's THD RoPE, which
rotates each chunk by its place in the whole sequence).

Everything but attention runs token by token on the rank's own tokens. Attention gathers the keys
and values of the whole row from the group (an all-gather whose backward sums the ranks' gradients:
all-to-alls on gloo), and each of the rank's query chunks attends causally to its sequence's keys up
to its own end (Llama 3's all-gather context parallelism, Dubey et al. 2024, arXiv:2407.21783).

Each rank computes the log-probs (values) of its own tokens' next tokens; `RowSplit.gather` hands
every rank the whole row's, so the loss is computed on every rank of the group, identically, and the
gather's backward keeps the rank's own part of that gradient. Megatron DDP sums the gradients over
the data- and context-parallel ranks, which sums the group's parts into the share's gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..common.collectives import all_gather_replicated, all_gather_summed


def padded_length(length: int, size: int) -> int:
    """A sequence's length in the row split over `size` ranks: a multiple of 2 x size (size > 1)."""
    multiple = 2 * size if size > 1 else 1
    return math.ceil(length / multiple) * multiple


@dataclass
class RowSplit:
    """A packed row of sequences (lengths in row order, each a multiple of 2 x size when size > 1)
    over the `size` ranks of a context-parallel group, this rank at `rank`."""

    lengths: list[int]
    size: int
    rank: int
    group: dist.ProcessGroup | None

    def chunks(self, rank: int | None = None) -> list[tuple[int, int, int]]:
        """(sequence, row start, length) of each stretch of the row a rank holds, in its order."""
        rank = self.rank if rank is None else rank
        out, start = [], 0
        for i, n in enumerate(self.lengths):
            if self.size == 1:
                out.append((i, start, n))
            else:
                c = n // (2 * self.size)
                out += [(i, start + rank * c, c), (i, start + (2 * self.size - 1 - rank) * c, c)]
            start += n
        return out

    def index(self, rank: int | None = None, device: torch.device | None = None) -> torch.Tensor:
        """[row / size] the row positions a rank holds, in its order."""
        spans = [torch.arange(a, a + n, device=device) for _, a, n in self.chunks(rank)]
        return torch.cat(spans) if spans else torch.zeros(0, dtype=torch.long, device=device)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The whole row [row, ...] from every rank's [row / size, ...], in row order. Every rank
        computes the same function of the result (the loss), so the backward keeps this rank's own
        part of its gradient (no communication)."""
        if self.size == 1:
            return local
        assert self.group is not None
        parts = all_gather_replicated(local, self.group).flatten(0, 1)
        order = torch.cat([self.index(r, local.device) for r in range(self.size)])
        return parts[torch.argsort(order)]


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: list[int],
    group: dist.ProcessGroup,
    scale: float,
) -> torch.Tensor:
    """Causal attention of this rank's query chunks [t, heads, dim] over their sequences' keys and
    values ([t, groups, dim] here, gathered from the group): [t, heads x dim]. `cu_seqlens`: the
    sequences' offsets in the whole row (THD's, each length a multiple of 2 x size)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    keys = all_gather_summed(key, group)  # [size, t, groups, dim]
    values = all_gather_summed(value, group)
    in_row = [(r, 0) for r in range(size)] + [(r, 1) for r in reversed(range(size))]  # chunk -> (rank, half)
    out = []
    for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        c, lo = (b - a) // (2 * size), a // size  # chunk length; the sequence's start among a rank's tokens
        if c == 0:
            continue
        k = torch.cat([keys[r, lo + h * c : lo + (h + 1) * c] for r, h in in_row])
        v = torch.cat([values[r, lo + h * c : lo + (h + 1) * c] for r, h in in_row])
        for half, chunk in ((0, rank), (1, 2 * size - 1 - rank)):
            q = query[lo + half * c : lo + (half + 1) * c]
            end = (chunk + 1) * c  # the chunk's end in its sequence: it sees the keys before it
            out.append(_causal(q, k[:end], v[:end], scale))
    return torch.cat(out)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [sq, heads, dim] at the last sq of k's sk positions, causal: [sq, heads x dim]."""
    sq, heads, _ = q.shape
    sk, groups, _ = k.shape
    k, v = k.repeat_interleave(heads // groups, dim=1), v.repeat_interleave(heads // groups, dim=1)
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return o.transpose(0, 1).reshape(sq, -1)
