"""Packed sequences on megatron-core: the THD layout on the local (non-TransformerEngine) layer spec.

A micro-batch runs as one packed row (backends/common/packed.py) with megatron's PackedSeqParams
(qkv_format "thd", cu_seqlens): rotary positions restart at each sequence (megatron-core's own THD
RoPE), and attention stays within each sequence. megatron-core's local DotProductAttention refuses
packed input (THD attention is TransformerEngine's), so `PackedDotProductAttention` takes it: each
sequence's queries, keys and values go through the local attention's own causal path on their own,
the exact computation of a padded row, with attention costing the sum of the squared lengths. With
context parallelism each rank holds a part of the row (context_parallel.py) and attention gathers
the rest.

Pipeline stages exchange fixed-shape activations, so with pipeline parallelism every micro-batch's
packed row is padded to the longest with a tail that is a sequence of its own (`tail`): it attends
only to itself and its outputs are dropped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.transformer_config import TransformerConfig

from ...core.algorithms.logprob import TEMPERATURE
from ..base import Batch
from ..common.packed import Packed, at_temperatures
from .context_parallel import RowSplit, attend, padded_length


class PackedDotProductAttention(DotProductAttention):
    """megatron-core's local attention that also takes THD packed sequences ([t, heads, dim] with
    packed_seq_params.cu_seqlens_q): one causal attention per sequence, or with context parallelism
    (packed_seq_params.cp_group of more than one rank) each of this rank's chunks over its sequence."""

    def __init__(self, config: TransformerConfig, *args, **kwargs):
        local = copy.copy(config)  # the local attention refuses context parallelism: this class takes it
        local.context_parallel_size = 1
        super().__init__(local, *args, **kwargs)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):  # fmt: skip
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        assert packed_seq_params.qkv_format == "thd", packed_seq_params.qkv_format
        cu = packed_seq_params.cu_seqlens_q.tolist()
        group = packed_seq_params.cp_group
        if group is not None and dist.get_world_size(group) > 1:
            return attend(query, key, value, cu, group, self.softmax_scale)
        outputs = [
            # [s, heads, dim] -> [s, b=1, heads, dim]; the local causal path; [s, 1, hp] -> [s, hp]
            super(PackedDotProductAttention, self)
            .forward(query[a:b, None], key[a:b, None], value[a:b, None], None, attn_mask_type, attention_bias)
            .squeeze(1)
            for a, b in zip(cu[:-1], cu[1:], strict=True)
            if b > a
        ]
        return torch.cat(outputs)


@dataclass
class PackedInput:
    """A micro-batch as the model's packed input on this rank. The row: every sequence (each padded
    to a multiple of 2 x the context-parallel size when that is > 1), then a padding tail that is a
    sequence of its own when a width is asked for; this rank's part of it: `split`."""

    layout: Packed
    split: RowSplit
    keep: torch.Tensor
    """[N] the row position of each real token, in the packed order."""
    input_ids: torch.Tensor
    """[1, row / C] this rank's tokens (and their positions, `position_ids`)."""
    position_ids: torch.Tensor
    targets: torch.Tensor
    """[row / C] the token after each of this rank's tokens in the row (0 after its last)."""
    params: PackedSeqParams

    @classmethod
    def of(cls, batch: dict[str, torch.Tensor], width: int | None = None) -> PackedInput:
        group = parallel_state.get_context_parallel_group()
        size = dist.get_world_size(group)
        layout = Packed.of(batch)
        device = layout.input_ids.device
        real = layout.lengths.tolist()
        lengths = [padded_length(n, size) for n in real]
        width = width or sum(lengths)
        if width > sum(lengths):
            lengths.append(width - sum(lengths))  # a tail: attends only to itself, outputs dropped
        starts = [0, *accumulate(lengths)]
        keep = torch.cat([torch.arange(s, s + n, device=device) for s, n in zip(starts, real, strict=False)])
        row = layout.input_ids.new_zeros(width)
        row[keep] = layout.input_ids[0]
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        split = RowSplit(lengths, size, dist.get_rank(group), group)
        mine = split.index(device=device)
        cu = torch.tensor(starts, dtype=torch.int32, device=device)
        params = PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths),
            max_seqlen_kv=max(lengths), cp_group=group,
        )  # fmt: skip
        targets = torch.cat([row[1:], row.new_zeros(1)])[mine]
        return cls(layout, split, keep, row[mine][None], positions[mine][None], targets, params)

    @staticmethod
    def width_of(batch: dict[str, torch.Tensor]) -> int:
        """The row's width without a tail."""
        size = parallel_state.get_context_parallel_world_size()
        return sum(padded_length(int(n), size) for n in batch["attention_mask"].sum(-1))

    @property
    def row_width(self) -> int:
        return sum(self.split.lengths)

    def tempered(self, logits: torch.Tensor, temperature: float, batch: Batch) -> torch.Tensor:
        """This rank's logits [row / C, V] divided by the temperature each sequence was sampled at
        (batch[TEMPERATURE] per row, else `temperature`); the tail's stay as they are."""
        rows = batch.get(TEMPERATURE)
        if rows is None:
            return at_temperatures(logits, [(logits.shape[0], temperature)])
        temps = rows.tolist()
        return at_temperatures(
            logits, [(n, temps[i] if i < len(temps) else 1.0) for i, _, n in self.split.chunks()]
        )

    def to_rows(self, local: torch.Tensor) -> torch.Tensor:
        """[B, T] in the trainer's layout from [row / C] values this rank computed about the token
        after each of its tokens (log-probs, entropies, a critic's values)."""
        return self.layout.from_predictions(self.split.gather(local)[self.keep][:-1])


def schedule_inputs(
    mbs: list[Batch], packs: bool, pipelined: bool, multiple: int = 1
) -> tuple[list[Batch], list[PackedInput | None]]:
    """The micro-batches as the schedule runs them, with each one's packed input (None each when the
    strategy does not pack). Pipelined stages exchange fixed-shape activations: packed rows get a
    padding tail to the longest, padded batches are padded to the most rows and the widest. With
    sequence parallelism each tensor-parallel rank takes an equal slice of the tokens: every width is
    then a multiple of `multiple` (the tensor-parallel size)."""
    if packs:
        widths = [PackedInput.width_of(mb) for mb in mbs]
        if pipelined:
            widths = [max(widths)] * len(widths)
        return mbs, [PackedInput.of(mb, _round_up(w, multiple)) for mb, w in zip(mbs, widths, strict=True)]
    if pipelined:
        rows = max(mb["input_ids"].shape[0] for mb in mbs)
        width = _round_up(max(mb["input_ids"].shape[1] for mb in mbs), multiple)
        mbs = [_pad(mb, rows, width) for mb in mbs]
    elif multiple > 1:
        mbs = [_pad(mb, mb["input_ids"].shape[0], _round_up(mb["input_ids"].shape[1], multiple)) for mb in mbs]
    return mbs, [None] * len(mbs)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad(mb: Batch, rows: int, width: int) -> Batch:
    """Right/bottom-pad every [B, T] field with zeros (padding rows have an all-zero loss mask), and
    every per-row [B] field (TEMPERATURE) to `rows`."""
    out = {}
    for k, v in mb.items():
        if v.dim() == 1:
            padded = v.new_zeros(rows)
            padded[: v.shape[0]] = v
        else:
            padded = v.new_zeros((rows, width) + tuple(v.shape[2:]))
            padded[: v.shape[0], : v.shape[1]] = v
        out[k] = padded
    return out
