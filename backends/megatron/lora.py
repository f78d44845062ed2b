"""LoRA adapters on megatron-core's local layers (model.lora_configs with --strategy megatron).

megatron-core 0.16 has no LoRA of its own. Each adapted HF projection gets its A and B beside the
megatron linear layer that computes it (`linear_qkv` computes q_proj, k_proj and v_proj;
`linear_fc1` gate_proj and up_proj), and a forward hook adds scale * B (A x) to that layer's output,
split over the tensor-parallel (TP) ranks the way the layer's weight is:

    column-parallel (linear_qkv, linear_fc1): A replicated, B split by rows like the weight. A x is
        the same on every TP rank; its gradient is summed over the TP group (each rank's rows of B
        give a part of it) by copy_to_tensor_model_parallel_region; each rank's B (A x) fills that
        rank's rows of the fused output (linear_qkv: per group of query heads, as mapping.py lays
        the weight out).
    row-parallel (linear_proj, linear_fc2): A split by columns like the weight, B replicated; the
        ranks' partial A x are summed over the TP group before B.

So every gradient is the one-device gradient, and the split factors carry megatron's TP attributes
(the grad norm counts each shard once and a replicated factor once). The adapter is in HF terms
where it enters (`Adapter`: a saved peft folder, or a fresh draw by common/lora.fresh_factor, the
same as the PyTorch-native strategies draw) and where it leaves (`MegatronLora.peft_entries`: the
peft model's state-dict stream), so common/lora.LoraLayout's views (merged weights, the adapter's
export and adapter-only sync) serve megatron unchanged. Checkpoints hold the adapter and its
optimizer state only (`is_adapter_key`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from ...core.config.schema import LoraConfig
from ...core.lora_files import per_layer, read_factors, scale_of, unsupported
from ...core.strategy_capabilities import MEGATRON_LORA_TARGETS
from ..common.lora import BASE_WEIGHT, PREFIX, LoraLayout, fresh_factor
from .full_tensors import FullTensors
from .mapping import ModelDims, stage_layers

KEY = "_lora."
"""What every adapter parameter's name (and checkpoint key) holds: `<linear>_lora.A.<part>`."""


@dataclass(frozen=True)
class Linear:
    """A megatron linear layer of a decoder layer and the HF projections it computes, in its order."""

    path: str
    """Inside a decoder layer, e.g. self_attention.linear_qkv."""
    module: str
    """The HF module of those projections inside a decoder layer (self_attn, mlp)."""
    parts: tuple[str, ...]
    row_parallel: bool


LINEARS = (
    Linear("self_attention.linear_qkv", "self_attn", ("q_proj", "k_proj", "v_proj"), False),
    Linear("self_attention.linear_proj", "self_attn", ("o_proj",), True),
    Linear("mlp.linear_fc1", "mlp", ("gate_proj", "up_proj"), False),
    Linear("mlp.linear_fc2", "mlp", ("down_proj",), True),
)
assert tuple(p for linear in LINEARS for p in linear.parts) == MEGATRON_LORA_TARGETS


def hf_layer(layer: int, linear: Linear, part: str) -> str:
    return f"model.layers.{layer}.{linear.module}.{part}"


def part_shape(part: str, dims: ModelDims) -> tuple[int, int]:
    """(out, in) of an HF projection's weight."""
    q, kv = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    return {
        "q_proj": (q, dims.hidden), "k_proj": (kv, dims.hidden), "v_proj": (kv, dims.hidden),
        "o_proj": (dims.hidden, q), "gate_proj": (dims.ffn, dims.hidden), "up_proj": (dims.ffn, dims.hidden),
        "down_proj": (dims.hidden, dims.ffn),
    }[part]  # fmt: skip


@dataclass
class Adapter:
    """A LoRA adapter in HF terms."""

    name: str
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """HF layer (model.layers.0.self_attn.q_proj) -> (A [r, in], B [out, r])."""
    scale: float
    config: dict[str, Any]
    """adapter_config.json's content."""


def load_adapter(cfg: LoraConfig, model_path: str, dims: ModelDims, seed: int) -> Adapter:
    """The adapter to train: the one saved at `cfg.path`, or a fresh one drawn from `seed`."""
    if dims.num_experts or dims.value_head:
        what = "a mixture-of-experts model" if dims.num_experts else "a value model"
        raise ValueError(
            f"model.lora_configs: megatron's LoRA adapts dense policies, not {what}; use --strategy fsdp2"
        )
    if cfg.path is not None:
        return _saved(cfg, dims)
    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    names = set(MEGATRON_LORA_TARGETS) if targets == "all-linear" else set(targets)
    if "all-linear" in names:
        names = (names - {"all-linear"}) | set(MEGATRON_LORA_TARGETS)
    _check_targets(names, "model.lora_configs[0].target_modules")
    if cfg.lora_dropout:
        raise ValueError(
            f"model.lora_configs[0].lora_dropout={cfg.lora_dropout}: megatron's adapters apply no dropout; "
            "set 0, or use --strategy fsdp2"
        )
    factors = {}
    for layer in range(dims.num_layers):
        for linear in LINEARS:
            for part in linear.parts:
                if part in names:
                    out, fan_in = part_shape(part, dims)
                    name = hf_layer(layer, linear, part)
                    factors[name] = (
                        fresh_factor(seed, name, cfg.lora_rank, fan_in),
                        torch.zeros(out, cfg.lora_rank),
                    )
    config = _peft_config(cfg, sorted(names), model_path)
    return Adapter(cfg.name, factors, cfg.lora_alpha / cfg.lora_rank, config)


def _check_targets(names: Iterable[str], where: str) -> None:
    unknown = sorted(set(names) - set(MEGATRON_LORA_TARGETS))
    if unknown:
        raise ValueError(
            f"{where}: megatron's adapters sit on {', '.join(MEGATRON_LORA_TARGETS)} (or all-linear); "
            f"got {', '.join(unknown)}: leave them out, or use --strategy fsdp2"
        )


def _peft_config(cfg: LoraConfig, targets: list[str], model_path: str) -> dict[str, Any]:
    """adapter_config.json's content for a fresh adapter, as peft writes it."""
    from peft import LoraConfig as PeftLoraConfig

    config = PeftLoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=targets,
        bias="none", task_type="CAUSAL_LM", base_model_name_or_path=model_path,
    ).to_dict()  # fmt: skip
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}


def _saved(cfg: LoraConfig, dims: ModelDims) -> Adapter:
    """The peft adapter folder at `cfg.path`."""
    assert cfg.path is not None
    where = "model.lora_configs[0].path"
    with open(os.path.join(cfg.path, "adapter_config.json")) as f:
        config = json.load(f)
    beyond = unsupported(config) + per_layer(config)
    beyond += ["lora_dropout"] if config.get("lora_dropout") else []
    if beyond:
        raise ValueError(
            f"{where}: the adapter at '{cfg.path}' uses {', '.join(beyond)}; megatron's adapters are plain LoRA "
            "of one rank and alpha, without dropout: use --strategy fsdp2"
        )
    try:
        factors = read_factors(os.path.join(cfg.path, "adapter_model.safetensors"))
    except (ValueError, OSError) as e:
        raise ValueError(f"{where}: the adapter at '{cfg.path}' {e}") from None
    parts = {layer.rsplit(".", 1)[-1] for layer in factors}
    _check_targets(parts, where)
    missing = sorted(
        name for layer in range(dims.num_layers) for linear in LINEARS for part in linear.parts
        if part in parts and (name := hf_layer(layer, linear, part)) not in factors
    )  # fmt: skip
    if missing:  # megatron's checkpoints hold a projection's factors for every layer at once
        raise ValueError(
            f"{where}: the adapter at '{cfg.path}' leaves out {missing[0]}; megatron's adapters sit on a projection "
            "in every layer or in none: use --strategy fsdp2"
        )
    rank = config["r"]
    for layer, (a, b) in factors.items():
        out, fan_in = part_shape(layer.rsplit(".", 1)[-1], dims)
        if a.shape != (rank, fan_in) or b.shape != (out, rank):
            raise ValueError(f"{where}: the adapter at '{cfg.path}' does not fit the model at {layer}")
    scale = scale_of(config)
    ordered = {
        name: (factors[name][0].float(), factors[name][1].float())
        for layer in range(dims.num_layers) for linear in LINEARS for part in linear.parts
        if (name := hf_layer(layer, linear, part)) in factors
    }  # fmt: skip
    return Adapter(cfg.name, ordered, scale, config)


class LoraLinear(torch.nn.Module):
    """One megatron linear layer's adapters (an A and a B per adapted projection, this TP rank's
    part of them) and the hook that adds them to the layer's output."""

    def __init__(
        self, linear: Linear, factors: dict[str, tuple[torch.Tensor, torch.Tensor]], widths: list[int],
        groups: int, scale: float, switch: dict[str, bool], dtype: torch.dtype, device: torch.device,
    ):  # fmt: skip
        super().__init__()
        self.linear, self.widths, self.groups, self.scale, self.switch = linear, widths, groups, scale, switch
        tp = parallel_state.get_tensor_model_parallel_world_size()
        rank = parallel_state.get_tensor_model_parallel_rank()
        self.A, self.B = torch.nn.ParameterDict(), torch.nn.ParameterDict()
        for part, (a, b) in factors.items():
            split, dim = (a, 1) if linear.row_parallel else (b, 0)
            shard = split.chunk(tp, dim)[rank]
            a, b = (shard, b) if linear.row_parallel else (a, shard)
            self.A[part] = torch.nn.Parameter(a.to(device=device, dtype=dtype).contiguous())
            self.B[part] = torch.nn.Parameter(b.to(device=device, dtype=dtype).contiguous())
            set_tensor_model_parallel_attributes(
                (self.A if linear.row_parallel else self.B)[part], True, dim, 1
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapters' share of the layer's output (this rank's part of it)."""
        if self.linear.row_parallel:
            (part,) = self.A.keys()
            h = reduce_from_tensor_model_parallel_region(F.linear(x, self.A[part]))
            return F.linear(h, self.B[part]) * self.scale
        parts = [p for p in self.linear.parts if p in self.A]
        h = copy_to_tensor_model_parallel_region(torch.cat([F.linear(x, self.A[p]) for p in parts], -1))
        deltas = dict(zip(parts, h.split([self.A[p].shape[0] for p in parts], -1), strict=True))
        lead = x.shape[:-1]
        outs = [
            F.linear(deltas[p], self.B[p]) * self.scale if p in deltas else x.new_zeros(*lead, width)
            for p, width in zip(self.linear.parts, self.widths, strict=True)
        ]
        return torch.cat([o.view(*lead, self.groups, -1) for o in outs], -1).view(*lead, -1)

    def hook(self, module: torch.nn.Module, args: tuple, output: tuple) -> tuple | None:
        if not self.switch["on"]:
            return None
        out, bias = output
        return out + self(args[0]).to(out.dtype), bias

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """The factors as megatron's checkpoints hold parameters: a split factor sharded on its TP
        dim (so a resume may change the TP size), a replicated one once."""
        split = "A" if self.linear.row_parallel else "B"
        dim = 1 if self.linear.row_parallel else 0
        axes = {f"{split}.{part}": dim for part in self.A}
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(keep_vars=True), prefix, axes, sharded_offsets
        )


def _needs_grad(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """The frozen embedding's output as a tensor that takes a gradient: megatron's activation
    recompute (a reentrant autograd Function) gives its layers' outputs a gradient only when an input
    has one, and the adapters inside them are no input of it (HF's enable_input_require_grads)."""
    return output if output.requires_grad else output.detach().requires_grad_()


def is_adapter_key(key: str) -> bool:
    return KEY in key


class MegatronLora:
    """The adapter on this rank's pipeline stage of a GPTModel (frozen: only the adapter trains)."""

    def __init__(self, module: GPTModel, adapter: Adapter, full: FullTensors, dtype: torch.dtype):
        module.requires_grad_(False)
        if getattr(module, "pre_process", False):  # the first stage: its embedding, frozen, has no grad
            module.embedding.register_forward_hook(_needs_grad)
        dims, device = full.dims, full.device
        self.full, self.dtype, self.name, self.switch = full, dtype, adapter.name, {"on": True}
        self.shapes = {layer: (tuple(a.shape), tuple(b.shape)) for layer, (a, b) in adapter.factors.items()}
        self.layout = LoraLayout(
            adapter.name,
            {PREFIX + layer: (adapter.scale, False) for layer in adapter.factors},
            adapter.config,
        )
        self.tp = parallel_state.get_tensor_model_parallel_world_size()
        pp = parallel_state.get_pipeline_model_parallel_world_size()
        self.stage_of = lambda layer: layer // (dims.num_layers // pp)
        self.local: dict[str, LoraLinear] = {}  # HF layer -> this stage's module holding its factors
        layers = stage_layers(dims, pp, parallel_state.get_pipeline_model_parallel_rank())
        for layer, decoder_layer in zip(layers, module.decoder.layers, strict=True):
            for linear in LINEARS:
                names = {p: hf_layer(layer, linear, p) for p in linear.parts}
                mine = {p: adapter.factors[name] for p, name in names.items() if name in adapter.factors}
                if not mine:
                    continue
                parent_path, attr = linear.path.rsplit(".", 1)
                parent = decoder_layer.get_submodule(parent_path)
                widths = [part_shape(p, dims)[0] // self.tp for p in linear.parts]
                groups = dims.num_kv_heads // self.tp if len(linear.parts) == 3 else 1  # qkv: per KV head
                lora = LoraLinear(linear, mine, widths, groups, adapter.scale, self.switch, dtype, device)
                parent.register_module(attr + "_lora", lora)
                getattr(parent, attr).register_forward_hook(lora.hook)
                self.local.update({names[p]: lora for p in mine})

    @contextmanager
    def off(self) -> Iterator[None]:
        """The base model (LoRA's reference policy): the adapters switched off."""
        self.switch["on"] = False
        try:
            yield
        finally:
            self.switch["on"] = True

    def factors(
        self, local_of: Callable[[torch.nn.Parameter], torch.Tensor], dtype: torch.dtype
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(peft state-dict name, full tensor in `dtype`) of every factor, A then B per adapted layer
        in model order, on every rank (collective): gathered over the TP group on the stage that
        holds it, broadcast from there. `local_of`: what of a parameter (itself, or its gradient)."""
        group = parallel_state.get_tensor_model_parallel_group()
        for layer, shapes in self.shapes.items():
            lora = self.local.get(layer)
            part = layer.rsplit(".", 1)[-1]
            for factor, shape in zip("AB", shapes, strict=True):
                full = None
                if lora is not None:
                    param = (lora.A if factor == "A" else lora.B)[part]
                    local = local_of(param).detach().to(dtype)
                    full = local
                    if getattr(param, "tensor_model_parallel", False) and self.tp > 1:
                        shards = [torch.empty_like(local) for _ in range(self.tp)]
                        dist.all_gather(shards, local.contiguous(), group=group)
                        full = torch.cat(shards, param.partition_dim)  # type: ignore[attr-defined]
                name = f"{PREFIX}{layer}.lora_{factor}.{self.name}.weight"
                yield name, self.full.from_stage(full, shape, dtype, self.stage_of(int(layer.split(".")[2])))

    def state(self, with_base: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """The peft model's state-dict stream LoraLayout's views read: the adapter's factors, and
        with `with_base` the base model's weights around them (collective)."""
        factors = dict(self.factors(lambda p: p, self.dtype))
        if with_base:
            yield from self.peft_entries(self.full.tensors(lambda p: p, self.dtype), factors)
        else:
            yield from factors.items()

    def peft_entries(
        self, hf_entries: Iterable[tuple[str, torch.Tensor]], factors: dict[str, torch.Tensor]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The peft model's state-dict stream (what LoraLayout's views read) from the base model's HF
        entries and the factors: an adapted layer's weight as its base layer's, then its A and B."""
        for name, tensor in hf_entries:
            layer = name.removesuffix(".weight")
            if not name.endswith(".weight") or PREFIX + layer not in self.layout.scales:
                yield PREFIX + name, tensor
                continue
            yield PREFIX + layer + BASE_WEIGHT, tensor
            for factor in "AB":
                key = f"{PREFIX}{layer}.lora_{factor}.{self.name}.weight"
                yield key, factors[key]

    def specs(
        self, hf_specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]] | None
    ) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of `state` (of the factors alone when `hf_specs` is None: the base
        model's weight_specs otherwise), without data."""
        factors = {
            f"{PREFIX}{layer}.lora_{factor}.{self.name}.weight": torch.empty(shape, dtype=self.dtype, device="meta")
            for layer, shapes in self.shapes.items() for factor, shape in zip("AB", shapes, strict=True)
        }  # fmt: skip
        if hf_specs is None:
            entries: Iterable[tuple[str, torch.Tensor]] = factors.items()
        else:
            meta = ((name, torch.empty(shape, dtype=d, device="meta")) for name, d, shape in hf_specs)
            entries = self.peft_entries(meta, factors)
        return [(name, t.dtype, tuple(t.shape)) for name, t in entries]
