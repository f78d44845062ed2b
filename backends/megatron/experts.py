"""A MoE layer's experts between HF and megatron-core (Qwen3-MoE; used by mapping.py).

megatron-core's local MoE layer holds its experts as a SequentialMLP: on each expert-parallel (EP)
rank, `local_experts.{j}.linear_fc1.weight` ([gate; up], as a dense MLP's fc1 with no tensor
parallelism) and `linear_fc2.weight` for its experts j = 0 .. E/EP - 1, global expert
ep_rank * E/EP + j. The mapping treats each layer's fc1s (and fc2s) as one unit, the experts
stacked along a first dim, so a unit maps to HF tensors as a dense parameter does:
- transformers 5 holds a layer's experts fused in memory: `experts.gate_up_proj` [E, 2I, H] (gate
  rows, then up rows) and `experts.down_proj` [E, H, I]: the stacked units themselves;
- transformers 4.x, and every checkpoint file, one module per expert: `experts.{e}.gate_proj.weight`
  [I, H], `up_proj`, `down_proj` [H, I].
Weights are read from either; they leave in the layout the installed transformers holds
(`ModelDims.fused_experts`), so they load into its models and its exports as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

import torch


class ModelDims(Protocol):
    """What of mapping.ModelDims (frozen) these functions read; mapping.py imports this module."""

    @property
    def hidden(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def moe_ffn(self) -> int: ...
    @property
    def fused_experts(self) -> bool: ...


_LOCAL_EXPERT = re.compile(r"^(.*\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12]\.weight)$")


def fused_in_memory(config: Any) -> bool:
    """Whether the installed transformers' model of `config` holds each layer's experts fused
    (`experts.gate_up_proj`), read from the model built on the meta device (no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return any(name.endswith("mlp.experts.gate_up_proj") for name, _ in model.named_parameters())


def hf_names(layer: int, fc1: bool, dims: ModelDims) -> list[str]:
    """HF names of layer `layer`'s experts unit (fc1: gate and up; else down), in `to_hf` order."""
    prefix = f"model.layers.{layer}.mlp.experts."
    if dims.fused_experts:
        return [prefix + ("gate_up_proj" if fc1 else "down_proj")]
    parts = ("gate_proj", "up_proj") if fc1 else ("down_proj",)
    return [f"{prefix}{e}.{part}.weight" for e in range(dims.num_experts) for part in parts]


def hf_shapes(fc1: bool, dims: ModelDims) -> list[tuple[int, ...]]:
    """The shapes of `hf_names`' tensors."""
    e, h, i = dims.num_experts, dims.hidden, dims.moe_ffn
    if dims.fused_experts:
        return [(e, 2 * i, h) if fc1 else (e, h, i)]
    return [(i, h)] * (2 * e) if fc1 else [(h, i)] * e


def local_stack(
    hf: Mapping[str, torch.Tensor], layer: int, fc1: bool, dims: ModelDims, ep_size: int, ep_rank: int
) -> torch.Tensor:
    """EP rank `ep_rank`'s experts of the unit, stacked [E/EP, ...], from HF tensors in either layout."""
    per_rank = dims.num_experts // ep_size
    first = ep_rank * per_rank
    prefix = f"model.layers.{layer}.mlp.experts."
    fused = prefix + ("gate_up_proj" if fc1 else "down_proj")
    if fused in hf:
        return hf[fused][first : first + per_rank]
    if fc1:
        return torch.stack(
            [torch.cat([hf[f"{prefix}{e}.gate_proj.weight"], hf[f"{prefix}{e}.up_proj.weight"]])
             for e in range(first, first + per_rank)]
        )  # fmt: skip
    return torch.stack([hf[f"{prefix}{e}.down_proj.weight"] for e in range(first, first + per_rank)])


def to_hf(stacked: torch.Tensor, fc1: bool, dims: ModelDims) -> list[torch.Tensor]:
    """Every expert of the unit, stacked [E, ...], as the tensors `hf_names` names."""
    if dims.fused_experts:
        return [stacked]
    if fc1:
        return [half for expert in stacked for half in expert.chunk(2)]
    return list(stacked)


def is_unit(name: str) -> bool:
    """Whether `name` (global or local) is a MoE layer's experts unit."""
    return name.endswith((".mlp.experts.linear_fc1.weight", ".mlp.experts.linear_fc2.weight"))


def unit_of(local_name: str) -> tuple[str, int] | None:
    """(the unit's local name, the local expert index) of a SequentialMLP parameter name; None for
    any other parameter."""
    match = _LOCAL_EXPERT.match(local_name)
    if match is None:
        return None
    return match.group(1) + match.group(3), int(match.group(2))


def local_params(unit: str, count: int) -> list[str]:
    """The local parameter names of a (local) unit name, in local expert order."""
    prefix, fc = unit.rsplit(".experts.", 1)
    return [f"{prefix}.experts.local_experts.{j}.{fc}" for j in range(count)]
