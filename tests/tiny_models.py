"""Tiny random HF models of every family the megatron mapping covers, built in memory with
transformers' own config and model classes, every weight (norms and biases too) re-drawn so that a
swapped or missed tensor cannot hide behind HF's ones-and-zeros initialisation."""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

# name -> (config class, model class, num_key_value_heads)
CASES = {
    "llama_mha": (LlamaConfig, LlamaForCausalLM, 4),
    "llama_gqa": (LlamaConfig, LlamaForCausalLM, 2),
    "qwen2_gqa": (Qwen2Config, Qwen2ForCausalLM, 2),
    "qwen3_gqa": (Qwen3Config, Qwen3ForCausalLM, 2),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, 2),
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}
"""The MoE case's experts: 4 of 32 wide, each token routed to 2."""


def tiny_hf_model(case: str, tied: bool) -> PreTrainedModel:
    """4 layers, hidden 64, 4 heads of 16, an odd vocabulary of 101 (TP 2 pads it), in eval mode;
    the MoE case with `MOE`'s experts."""
    config_cls, model_cls, kv_heads = CASES[case]
    config = config_cls(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=16,
        num_hidden_layers=4,
        intermediate_size=128,
        vocab_size=101,  # odd: tp=2 pads it to 102
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **(MOE if config_cls is Qwen3MoeConfig else {}),
    )
    torch.manual_seed(0)
    model = model_cls(config).eval()
    # scale 0.2 keeps activations near 1, so float32 tolerances mean something
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model
