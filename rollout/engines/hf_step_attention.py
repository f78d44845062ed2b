"""The attention of the HF engine's static decode step (hf_static.py): one query token per row
against the row's slice of the static KV cache, without copying the cache.

transformers' "sdpa" attention makes key and value contiguous before SDPA when a mask is given on
CUDA, and the static cache's views (the first L slots of a [B, KV, capacity, D] buffer) are not:
on one H200 those two copies were 0.96 ms of a 4.1 ms decode step for the 358M benchmark model
(bench decode), and SDPA then picked cuDNN's kernel, 0.6 ms more. Here the step's query heads are
regrouped by the KV head they read ([B, H, 1, D] -> [B, KV, H/KV, D]: a decode query is one token,
so a KV head's query heads are its "sequence"), which needs neither a copy of the cache nor
grouped-head support, and SDPA reads the cache views in place; on CUDA it runs the memory-efficient
kernel (strided inputs, a boolean mask). The mask is the step's [B, 1, 1, L] (hf_static.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

NAME = "rlcore_static_decode"
"""The attention implementation's name in HF's AttentionInterface (used inside the static step)."""
CUDA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA kernels the step may use on CUDA, in order (math only where the efficient one refuses)."""


def static_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [B, H, 1, D], key/value [B, KV, L, D] (views of the cache), mask [B, 1, 1, >= L]
    -> [B, 1, H, D]."""
    batch, heads, tokens, dim = query.shape
    kv_heads = key.shape[1]
    assert tokens == 1, f"the static decode step feeds one token per row, got {tokens}"
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # HF's head h reads KV head h // (H / KV)
    mask = None if attention_mask is None else attention_mask[:, :, :, : key.shape[-2]]
    if query.is_cuda:
        with sdpa_kernel(CUDA_BACKENDS):
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    else:
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, 1, heads, dim), None


def register() -> None:
    """Make NAME known to transformers (the attention function, and SDPA's boolean masks)."""
    AttentionInterface.register(NAME, static_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
