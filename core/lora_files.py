"""A LoRA adapter folder as peft's save_pretrained writes it (adapter_config.json and
adapter_model.safetensors): what in it goes beyond the plain LoRA rlcore trains and serves, and its
factors by layer. Torch is imported only to read the factors."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PREFIX = "base_model.model."
"""What peft puts in front of the model's own module names in a saved adapter."""
FACTOR = re.compile(r"^(.+)\.lora_([AB])\.weight$")
"""A plain LoRA factor's saved name: `<module>.lora_A.weight` or `<module>.lora_B.weight`."""


def unsupported(config: dict[str, Any]) -> list[str]:
    """What adapter_config.json asks for beyond plain LoRA (r, alpha, dropout, target modules)."""
    return [
        what for what, on in (
            ("a peft_type other than LORA", config.get("peft_type", "LORA") != "LORA"),
            ("DoRA (use_dora)", bool(config.get("use_dora"))),
            ("modules_to_save", bool(config.get("modules_to_save"))),
            (f"bias '{config.get('bias')}'", config.get("bias", "none") != "none"),
            ("lora_bias", bool(config.get("lora_bias"))),
        ) if on
    ]  # fmt: skip


def per_layer(config: dict[str, Any]) -> list[str]:
    """The per-layer ranks or alphas adapter_config.json sets (peft reads them; rlcore's megatron
    adapters and its engines take one rank and alpha)."""
    return [key for key in ("rank_pattern", "alpha_pattern") if config.get(key)]


def scale_of(config: dict[str, Any]) -> float:
    """The update's scale, lora_alpha / r (/ sqrt(r) with use_rslora), as peft computes it."""
    rank = config["r"]
    return config["lora_alpha"] / (math.sqrt(rank) if config.get("use_rslora") else rank)


def read_factors(weights_file: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module name (the model's own) -> (A [r, in], B [out, r]) of every adapted layer, in the file's
    order. ValueError in one line for an entry that is no plain LoRA factor (a bias, DoRA's magnitude,
    an embedding's factors) or a layer with only one of its factors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(weights_file)
    except SafetensorError as e:
        raise ValueError(f"holds an adapter_model.safetensors that cannot be read ({e})") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        match = FACTOR.match(key.removeprefix(PREFIX))
        if match is None:
            raise ValueError(f"holds {key}, which is no plain LoRA factor (lora_A.weight / lora_B.weight)")
        pairs.setdefault(match[1], {})[match[2]] = tensor
    lone = [module for module, pair in pairs.items() if len(pair) < 2]
    if lone:
        raise ValueError(f"holds only one of the factors A and B of {lone[0]}")
    if not pairs:
        raise ValueError("holds no LoRA factors")
    return {module: (pair["A"], pair["B"]) for module, pair in pairs.items()}
