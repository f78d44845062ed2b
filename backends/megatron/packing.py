"""Packed sequences on megatron-core: the THD layout on the local (non-TransformerEngine) layer spec.

A micro-batch runs as one packed row (backends/common/packed.py) with megatron's PackedSeqParams
(qkv_format "thd", cu_seqlens): rotary positions restart at each sequence (megatron-core's own THD
RoPE), and attention stays within each sequence. megatron-core's local DotProductAttention refuses
packed input (THD attention is TransformerEngine's), so `PackedDotProductAttention` takes it: each
sequence's queries, keys and values go through the local attention's own causal path on their own,
the exact computation of a padded row, with attention costing the sum of the squared lengths.

Pipeline stages exchange fixed-shape activations, so with pipeline parallelism every micro-batch's
packed row is padded to the longest with a tail that is a sequence of its own (`tail`): it attends
only to itself and its outputs are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.spec_utils import ModuleSpec

from ..base import Batch
from ..common.packed import Packed


class PackedDotProductAttention(DotProductAttention):
    """megatron-core's local attention that also takes THD packed sequences ([t, heads, dim] with
    packed_seq_params.cu_seqlens_q): one causal attention per sequence."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):  # fmt: skip
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        assert packed_seq_params.qkv_format == "thd", packed_seq_params.qkv_format
        cu = packed_seq_params.cu_seqlens_q.tolist()
        outputs = [
            # [s, heads, dim] -> [s, b=1, heads, dim]; the local causal path; [s, 1, hp] -> [s, hp]
            super(PackedDotProductAttention, self)
            .forward(query[a:b, None], key[a:b, None], value[a:b, None], None, attn_mask_type, attention_bias)
            .squeeze(1)
            for a, b in zip(cu[:-1], cu[1:], strict=True)
            if b > a
        ]
        return torch.cat(outputs)


def packed_layer_spec() -> ModuleSpec:
    """The local GPT layer spec with PackedDotProductAttention as its core attention."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    return spec


@dataclass
class PackedInput:
    """A micro-batch as the model's packed input: ids and positions [1, width] (width >= the real
    tokens; the rest a padding tail), and the PackedSeqParams saying where each sequence sits."""

    layout: Packed
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    params: PackedSeqParams

    @classmethod
    def of(cls, batch: dict[str, torch.Tensor], width: int | None = None) -> PackedInput:
        layout = Packed.of(batch)
        width = width or layout.num_tokens
        ids, pos, offsets = layout.padded(width)  # a tail: a sequence of its own, attending only to itself
        cu = torch.tensor(offsets, dtype=torch.int32, device=ids.device)
        longest = max(layout.max_seqlen, width - layout.num_tokens)
        params = PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest,
            cp_group=parallel_state.get_context_parallel_group(),
        )  # fmt: skip
        return cls(layout, ids, pos, params)

    def real(self, output: torch.Tensor) -> torch.Tensor:
        """The model's output [1, width, ...] without the padding tail: [1, N, ...]."""
        return output[:, : self.layout.num_tokens]


def schedule_inputs(
    mbs: list[Batch], packs: bool, pipelined: bool
) -> tuple[list[Batch], list[PackedInput | None]]:
    """The micro-batches as the schedule runs them, with each one's packed input (None each when the
    strategy does not pack). Pipelined stages exchange fixed-shape activations: packed rows get a
    padding tail to the longest, padded batches are padded to the most rows and the widest."""
    if packs:
        width = max(int(mb["attention_mask"].sum()) for mb in mbs) if pipelined else None
        return mbs, [PackedInput.of(mb, width) for mb in mbs]
    if pipelined:
        rows = max(mb["input_ids"].shape[0] for mb in mbs)
        width = max(mb["input_ids"].shape[1] for mb in mbs)
        mbs = [_pad(mb, rows, width) for mb in mbs]
    return mbs, [None] * len(mbs)


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
