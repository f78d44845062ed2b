"""The attention the native strategies give HF models on packed rows (packed.py): causal within each
packed sequence, so its cost is the sum of the squared lengths (not the square of the row's) and no
mask is built. On a GPU in bf16/fp16 it is one variable-length flash-attention call for the whole
row (torch.nn.attention.varlen); elsewhere (the CPU, float32) one scaled-dot-product attention per
sequence, which keeps SDPA's causal kernel: on a GPU the per-sequence loop cost more than the
padding it saved (bench packing, one H200: packed 0.80x padded-by-length before the varlen call).
With Ulysses (ulysses.py) it first trades the rank's token slice for a share of the heads over the
sequence-parallel group, and trades back after.

It is an HF attention function (`ATTENTION` in transformers' AttentionInterface): the strategy
switches a model to it (`use_packed_attention`) and passes each packed forward `row_kwargs`, which
say where the row's sequences start (keywords, not state: a layer recomputed by gradient
checkpointing gets them again). Models whose attention needs more than a causal mask
and a scale (a sliding window, logit soft-capping, attention sinks) are refused in one line.
"""

from __future__ import annotations

import inspect
from functools import cache, lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from .ulysses import SequenceParallel

ATTENTION = "rlcore_packed"
"""The attention implementation's name in HF's AttentionInterface."""

ROW = "rlcore_cu_seqlens"
"""The model-call keyword holding the packed row's sequence offsets (a list of ints). HF passes a
model call's extra keywords down to every attention call, so they travel with the layer's inputs and
come back with them when gradient checkpointing recomputes a layer in the backward pass."""
GROUP = "rlcore_sequence_parallel"
"""The model-call keyword holding the row's SequenceParallel group (Ulysses), or None."""


def row_kwargs(cu_seqlens: list[int], sp: SequenceParallel | None = None) -> dict[str, Any]:
    """The keywords a packed forward passes to the model: model(..., **row_kwargs(cu, sp))."""
    return {ROW: cu_seqlens, GROUP: sp}


UNSUPPORTED = ("sliding_window", "softcap", "s_aux")
"""Attention arguments of HF models that packed_attention does not apply (refused when set)."""


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF's attention-function interface: query [1, H, n, D], key and value [1, H_kv, n, D] of the
    packed row (this rank's slice of it with Ulysses) -> [1, n, H, D]; the row's offsets and group
    come in the ROW and GROUP keywords. Without them: [B, H, n, D] of right-padded rows, causal over
    each (what a padded forward computes)."""
    unsupported = [k for k in UNSUPPORTED if kwargs.get(k) is not None]
    if unsupported:
        raise ValueError(
            f"trainer.use_remove_padding: {type(module).__name__} attends with {', '.join(unsupported)}, "
            "which packed attention does not apply; set trainer.use_remove_padding=false"
        )
    # without a packed row: a right-padded batch, each row one sequence from its first position
    cu, sp = kwargs.get(ROW) or [0, query.shape[2]], kwargs.get(GROUP)
    heads, kv_heads = query.shape[1], key.shape[1]
    if sp is not None:
        if kv_heads % sp.size:  # fewer KV heads than ranks: each rank takes the KV heads its queries read
            key = key.repeat_interleave(heads // kv_heads, dim=1)
            value = value.repeat_interleave(heads // kv_heads, dim=1)
        query, key, value = (sp.seq_to_heads(t) for t in (query, key, value))
    p = dropout if module.training else 0.0
    varlen = _varlen_call(query, scaling) if p == 0.0 and query.shape[0] == 1 else None
    out = (
        varlen(query, key, value, cu)
        if varlen is not None
        else _per_sequence(query, key, value, cu, p, scaling)
    )
    if sp is not None:
        out = sp.heads_to_seq(out)
    return out.transpose(1, 2).contiguous(), None


GROUPED_FROM = 4
"""Sequences per distinct length, on average, from which a row's attention is grouped by length:
regrouping copies each group, which costs more than the calls it saves below that (measured on the
CPU, fwd+bwd: 128 sequences of 13 lengths 4.7x faster grouped; 64 of 29 lengths 1.5x slower,
8 of 7 lengths 3.5x slower)."""


def _per_sequence(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: list[int],
    p: float,
    scaling: float | None,
) -> torch.Tensor:
    """[B, H, n, D] query, [B, H_kv, n, D] key and value -> [B, H, n, D]: causal attention within each
    sequence of the row(s). The sequences of one length are one batched SDPA call (a packed row of
    RL rollouts holds few distinct lengths: a call per sequence cost 5x the time on a CPU); each
    sequence's numbers are those of a call of its own. Where fewer than GROUPED_FROM sequences share
    a length on average, one call per sequence; with dropout too (the random masks drawn as before)."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if len(cu) == 2 and cu[0] == 0:  # one sequence (a right-padded batch): no regrouping
        return F.scaled_dot_product_attention(query, key, value, dropout_p=p, is_causal=True, scale=scaling)
    order, lengths, inverse = _length_groups(tuple(cu), query.device)
    if p > 0.0 or GROUPED_FROM * len(lengths) > sum(count for count, _ in lengths):
        return torch.cat(
            [
                F.scaled_dot_product_attention(
                    query[:, :, a:b],
                    key[:, :, a:b],
                    value[:, :, a:b],
                    dropout_p=p,
                    is_causal=True,
                    scale=scaling,
                )
                for a, b in zip(cu[:-1], cu[1:], strict=True)
                if b > a
            ],
            dim=2,
        )
    query, key, value = (t[:, :, order] for t in (query, key, value))
    outs, at = [], 0
    for count, length in lengths:
        span = slice(at, at + count * length)
        q, k, v = (_as_batch(t[:, :, span], count) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
        outs.append(_as_row(out, query.shape[0]))
        at = span.stop
    return torch.cat(outs, dim=2)[:, :, inverse]


def _as_batch(t: torch.Tensor, count: int) -> torch.Tensor:
    """[B, H, count x length, D] (sequences of one length one after another) -> [B x count, H, length, D]."""
    b, h, n, d = t.shape
    return t.reshape(b, h, count, n // count, d).transpose(1, 2).reshape(b * count, h, n // count, d)


def _as_row(t: torch.Tensor, batch: int) -> torch.Tensor:
    """_as_batch's inverse: [B x count, H, length, D] -> [B, H, count x length, D]."""
    bc, h, length, d = t.shape
    return (
        t.reshape(batch, bc // batch, h, length, d).transpose(1, 2).reshape(batch, h, bc // batch * length, d)
    )


@lru_cache(maxsize=8)
def _length_groups(
    cu: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, tuple[tuple[int, int], ...], torch.Tensor]:
    """The row's positions ordered by sequence length (the sequences of each length together, each
    in order), (count, length) of each group, and the permutation back to the row's order."""
    starts: dict[int, list[int]] = {}
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        if b > a:
            starts.setdefault(b - a, []).append(a)
    order = torch.tensor(
        [a + i for length, at in starts.items() for a in at for i in range(length)], device=device
    )
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=device)
    return order, tuple((len(at), length) for length, at in starts.items()), inverse


VARLEN_DTYPES = (torch.bfloat16, torch.float16)
"""The dtypes flash attention (torch's varlen call) computes in."""


@cache
def _varlen_signature() -> frozenset[str] | None:
    """The keyword names of torch.nn.attention.varlen.varlen_attn, None where torch lacks it. Its
    signature changed between releases: torch 2.9-2.11 take `is_causal` (and repeat no KV heads),
    later ones `window_size=(-1, 0)` for causal and `enable_gqa`."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return frozenset(inspect.signature(varlen_attn).parameters)


@lru_cache(maxsize=4)
def _row_offsets(cu: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, int]:
    """The row's offsets on `device` and its longest sequence: copied once per packed row, not in
    every layer (a copy from the host waits for the device's queue)."""
    longest = max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True))
    return torch.tensor(cu, dtype=torch.int32, device=device), longest


def _varlen_call(query: torch.Tensor, scaling: float | None) -> Any:
    """The whole packed row's attention in one varlen flash-attention call, or None where it does
    not apply: off CUDA, outside bf16/fp16, torch without varlen_attn, or a scale it cannot take."""
    if not query.is_cuda or query.dtype not in VARLEN_DTYPES:
        return None  # before importing torch's varlen module (0.3 s where it is never used)
    names = _varlen_signature()
    if names is None:
        return None
    default_scale = query.shape[-1] ** -0.5
    if scaling is not None and "scale" not in names and abs(scaling - default_scale) > 1e-12 * default_scale:
        return None
    from torch.nn.attention.varlen import varlen_attn

    def call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: list[int]) -> torch.Tensor:
        """[1, H, n, D] query, [1, H_kv, n, D] key and value -> [1, H, n, D]."""
        kw: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in names else {"is_causal": True}
        if "scale" in names:
            kw["scale"] = scaling
        groups = query.shape[1] // key.shape[1]
        if groups > 1 and "enable_gqa" in names:
            kw["enable_gqa"] = True
        elif groups > 1:
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [n, heads, D]
        offsets, longest = _row_offsets(tuple(cu), query.device)
        out = varlen_attn(q, k, v, offsets, offsets, longest, longest, **kw)
        assert isinstance(out, torch.Tensor)  # no auxiliary outputs were asked for
        return out.transpose(0, 1)[None]

    return call


def use_packed_attention(model: torch.nn.Module, sp_size: int = 1) -> None:
    """Switch an HF model (a peft model's base included) to packed_attention; with Ulysses its heads
    must split evenly over the group. A model whose code is not transformers' own (remote code may
    not dispatch attention through AttentionInterface) is refused in one line."""
    from transformers import AttentionInterface

    config: Any = model.config
    where = type(model).__module__
    if not where.startswith("transformers."):
        raise ValueError(
            f"trainer.use_remove_padding: {type(model).__name__} ({where}) is not a transformers model, "
            "whose attention packed sequences need; set trainer.use_remove_padding=false"
        )
    if config.num_attention_heads % sp_size:
        raise ValueError(
            f"trainer.ulysses_sequence_parallel_size: {sp_size} must divide the model's "
            f"{config.num_attention_heads} attention heads"
        )
    AttentionInterface.register(ATTENTION, packed_attention)
    config._attn_implementation = ATTENTION
