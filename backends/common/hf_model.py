"""Loading HF causal LMs for training and computing per-token log-probs from them."""

from __future__ import annotations

import torch

from ...core.algorithms.logprob import entropy_from_logits, token_logprobs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return DTYPES[dtype]


def load_causal_lm(model_path: str, gradient_checkpointing: bool = False) -> torch.nn.Module:
    """Float32 master weights on CPU; strategies shard and move them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder blocks, found by HF's `_no_split_modules` class names."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"cannot find the decoder blocks of {type(model).__name__} (no _no_split_modules)")
    return blocks


def forward_logprobs(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, T] (position t: log p(input_ids[t] | <t)); position 0 is 0.

    Logits are divided by the sampling temperature so the trainer scores the same distribution the
    engine sampled from.

    Batches are right-padded (core/batch.py), so plain causal attention gives every real position
    exactly what the padding mask would: padding only ever comes after it. Leaving the mask out lets
    SDPA run its causal kernel without building a [B, 1, T, T] mask (10% of a small model's
    forward/backward on CPU); padding positions get values the loss mask ignores.
    """
    input_ids = batch["input_ids"]
    logits = model(input_ids=input_ids, use_cache=False).logits
    logits = logits[:, :-1]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lp = token_logprobs(logits, input_ids[:, 1:])
    zeros = lp.new_zeros((lp.shape[0], 1))
    logprobs = torch.cat([zeros, lp], dim=1)
    entropy = None
    if with_entropy:
        ent = entropy_from_logits(logits)
        entropy = torch.cat([zeros, ent], dim=1)
    return logprobs, entropy
