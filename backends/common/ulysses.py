"""Ulysses sequence parallelism for the HF models of the native strategies (fsdp, fsdp2).

`trainer.ulysses_sequence_parallel_size` S > 1 groups the trainer ranks S at a time: a group shares
one data-parallel share of the batch, and each micro-batch's packed row (packed.py) is cut into S
equal slices, one per rank, so a sequence S times longer than one rank's budget trains. Everything
in a decoder block but attention works token by token on the rank's slice; attention (attention.py)
trades the slices for heads with an all-to-all (`seq_to_heads`), so each rank attends over the whole
row for H / S heads, causal within each packed sequence, and trades back (`heads_to_seq`; Jacobs et
al. 2023, DeepSpeed-Ulysses, arXiv:2309.14509).

Each rank computes the log-probs (values) of its slice's next tokens; an all-gather that carries
gradients gives every rank of the group the whole row's, so the loss is computed as without
sequence parallelism, S times. The all-gather's backward sums the S copies' gradients, and the
strategy scales the loss by the data-parallel size instead of the world size (FSDP averages over all
ranks), so each parameter's gradient is the one the whole share gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from .collectives import all_gather_summed


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
        return all_gather_summed(local, self.group).flatten(0, 1)

    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[1, H, chunk, D] of this rank's slice -> [1, H / S, S x chunk, D]: the whole row, its heads."""
        _, h, chunk, d = x.shape
        send = x.reshape(self.size, h // self.size, chunk, d).contiguous()  # head groups, one per rank
        got = dist_fn.all_to_all_single(torch.empty_like(send), send, group=self.group)  # a slice per rank
        return got.permute(1, 0, 2, 3).reshape(1, h // self.size, self.size * chunk, d)

    def heads_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of seq_to_heads: [1, H / S, S x chunk, D] -> [1, H, chunk, D]."""
        _, hs, n, d = x.shape
        send = (
            x.reshape(hs, self.size, n // self.size, d).permute(1, 0, 2, 3).contiguous()
        )  # a slice per rank
        got = dist_fn.all_to_all_single(torch.empty_like(send), send, group=self.group)  # head groups by rank
        return got.reshape(1, self.size * hs, n // self.size, d)
