"""LoRA adapters through peft on the PyTorch-native strategies (model.lora_configs).

The policy is a peft model: the base weights are frozen, each targeted linear layer computes
W x + scale * B (A x). Its state dict names the base weight `<layer>.base_layer.weight` and the
adapter `<layer>.lora_A.<name>.weight` / `<layer>.lora_B.<name>.weight`, all under
`base_model.model.`. Two views of that state, both streamed one tensor at a time:

    merged    HF names and W + scale * B @ A: what the engines load and the HF export writes
              (merged per layer as its tensors pass, never a merged copy of the whole model)
    adapter   the adapter's tensors under the names peft saves them with (`<layer>.lora_A.weight`):
              the adapter export, and the gradients the parity checks compare
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ...core.config.schema import LoraConfig

PREFIX = "base_model.model."
"""What peft puts in front of the wrapped model's own state-dict names."""
BASE = ".base_layer"
BASE_WEIGHT = BASE + ".weight"
FACTORS = ("lora_A", "lora_B")


def fresh_factor(seed: int, layer: str, rank: int, fan_in: int) -> torch.Tensor:
    """A fresh adapter's A [rank, fan_in] for HF layer `layer` (e.g. model.layers.0.self_attn.q_proj):
    uniform in +-1/sqrt(fan_in), peft's kaiming-uniform draw (a = sqrt(5)), from `seed` and the
    layer's name alone, so a fresh adapter is the same on every strategy, rank and parallel layout
    (B starts at zero: the first policy is the base model)."""
    digest = hashlib.blake2b(f"{seed}:{layer}".encode(), digest_size=8).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
    draw = torch.rand(rank, fan_in, generator=generator, dtype=torch.float64)
    return ((draw * 2 - 1) / math.sqrt(fan_in)).float()


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, seed: int) -> torch.nn.Module:
    """`model` (an HF causal LM, float32) as a peft model: a fresh adapter initialised from `seed`
    (A by `fresh_factor`, B zero), or the one saved at `cfg.path`, trainable; every base weight frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    if cfg.path is not None:
        peft_model = PeftModel.from_pretrained(model, cfg.path, adapter_name=cfg.name, is_trainable=True)
    else:
        targets = cfg.target_modules if isinstance(cfg.target_modules, str) else _named(model, cfg.target_modules)
        config = PeftLoraConfig(
            r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=targets, bias="none", task_type="CAUSAL_LM",
        )  # fmt: skip
        try:
            peft_model = get_peft_model(model, config, adapter_name=cfg.name)
        except ValueError as e:  # peft's "Target modules {...} not found in the base model"
            raise ValueError(f"model.lora_configs[0].target_modules: {' '.join(str(e).split())}") from None
        _draw_fresh(peft_model, cfg.name, seed)
    saved = peft_model.peft_config[cfg.name]  # type: ignore[index]
    unsupported = [
        what for what, on in (
            ("DoRA (use_dora)", getattr(saved, "use_dora", False)),
            ("modules_to_save", bool(getattr(saved, "modules_to_save", None))),
            (f"bias '{getattr(saved, 'bias', 'none')}'", getattr(saved, "bias", "none") != "none"),
        ) if on
    ]  # fmt: skip
    if unsupported:
        raise ValueError(
            f"model.lora_configs[0].path: the adapter at '{cfg.path}' uses {', '.join(unsupported)}; rlcore "
            "trains plain LoRA adapters (r, alpha, dropout, target modules)"
        )
    if cfg.lora_dtype in ("auto", "float32"):  # master weights are float32, the adapter's too
        for p in peft_model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    if not any(p.requires_grad for p in peft_model.parameters()):
        raise ValueError(
            f"model.lora_configs[0].target_modules: no layer of the model matches {cfg.target_modules!r}"
        )
    return peft_model


@torch.no_grad()
def _draw_fresh(peft_model: torch.nn.Module, adapter: str, seed: int) -> None:
    """Every adapted layer's A drawn by `fresh_factor` (in place of peft's draw from the global RNG,
    which depends on the order layers are built in)."""
    from peft.tuners.lora import LoraLayer

    for name, m in peft_model.named_modules():
        if isinstance(m, LoraLayer) and adapter in m.lora_A:
            weight: torch.Tensor = m.lora_A[adapter].weight  # type: ignore[index,assignment]
            rank, fan_in = weight.shape
            weight.copy_(fresh_factor(seed, name.removeprefix(PREFIX), rank, fan_in))


def _named(model: torch.nn.Module, targets: Iterable[str]) -> list[str]:
    """A target list with `all-linear` in it as module names: every linear layer's but the output
    head's (peft's all-linear), and the others the list names."""
    names = set(targets)
    if "all-linear" in names:
        from transformers import PreTrainedModel
        from transformers.pytorch_utils import Conv1D

        head = model.get_output_embeddings() if isinstance(model, PreTrainedModel) else None
        names.discard("all-linear")
        names |= {
            name.split(".")[-1] for name, m in model.named_modules()
            if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head
        }  # fmt: skip
    return sorted(names)


@dataclass(frozen=True)
class LoraLayout:
    """What the views need to know about the peft model: each adapted layer's scale and whether its
    weight is stored transposed (GPT-2's Conv1D), and the adapter's peft config."""

    adapter: str
    scales: dict[str, tuple[float, bool]]
    """Layer path (peft state-dict name without the parameter) -> (lora_alpha / r, fan_in_fan_out)."""
    config: dict[str, Any]
    """adapter_config.json's content."""

    @classmethod
    def of(cls, peft_model: torch.nn.Module, adapter: str) -> LoraLayout:
        from peft.tuners.lora import LoraLayer

        scales = {
            name: (float(m.scaling[adapter]), bool(getattr(m, "fan_in_fan_out", False)))
            for name, m in peft_model.named_modules()
            if isinstance(m, LoraLayer) and adapter in m.scaling
        }
        config = peft_model.peft_config[adapter].to_dict()  # type: ignore[attr-defined,index,operator,union-attr]
        for key, value in config.items():  # sets (target_modules) are not JSON
            if isinstance(value, set):
                config[key] = sorted(value)
        return cls(adapter, scales, config)

    def is_adapter(self, name: str) -> bool:
        """Whether state-dict entry `name` is one of the adapter's factors."""
        return any(f".{f}.{self.adapter}." in name for f in FACTORS)

    def hf_name(self, name: str) -> str:
        """The merged model's name of a base entry."""
        name = name.removeprefix(PREFIX)
        return name.replace(BASE + ".", ".")

    def saved_name(self, name: str) -> str:
        """peft's saved name of an adapter entry (the adapter's own name left out)."""
        return name.replace(f".{self.adapter}.", ".")

    def _layer(self, name: str) -> str | None:
        """The adapted layer an entry belongs to (its base weight or a factor), else None."""
        for marker in (BASE + ".", *(f".{f}.{self.adapter}." for f in FACTORS)):
            if marker in name:
                return name.split(marker)[0]
        return None

    def merged(self, entries: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF model's entries, in order, from the peft model's (`entries`, in state-dict order):
        an adapted layer's base entries wait until its A and B have passed, then its weight comes
        out as W + scale * B @ A."""
        held: list[tuple[str, torch.Tensor]] = []
        factors: dict[str, torch.Tensor] = {}
        for name, tensor in entries:
            layer = self._layer(name)
            if layer is None or layer not in self.scales:
                yield self.hf_name(name), tensor
                continue
            if not self.is_adapter(name):
                held.append((name, tensor))
                continue
            factors["A" if f".lora_A.{self.adapter}." in name else "B"] = tensor
            if len(factors) < 2:
                continue
            scale, transposed = self.scales[layer]
            delta = (factors["B"].float() @ factors["A"].float()) * scale
            for base_name, base in held:
                if base_name.endswith(BASE_WEIGHT):
                    base = base + (delta.T if transposed else delta).to(base.dtype)
                yield self.hf_name(base_name), base
            held, factors = [], {}
        assert not held and not factors, "an adapted layer's A or B never came"

    def specs(
        self, specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]
    ) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """`merged`'s (name, dtype, shape), in its order, from the peft model's: `merged` itself run
        on shapes alone (meta tensors, no data)."""
        meta = ((name, torch.empty(shape, dtype=dtype, device="meta")) for name, dtype, shape in specs)
        return [(name, t.dtype, tuple(t.shape)) for name, t in self.merged(meta)]

    def sync_entries(
        self, entries: Iterable[tuple[str, torch.Tensor]], with_base: bool
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Adapter-only sync's entries (weights/adapter.py) from the peft model's (in state-dict
        order): each adapted layer's A and B under its HF name, then its scale; `with_base`: also its
        base weight, and every entry no adapter touches under its HF name."""
        from ...weights.adapter import BASE, FACTOR_A, FACTOR_B, SCALE, scale_entry

        done: set[str] = set()
        for name, tensor in entries:
            layer = self._layer(name)
            if layer is None or layer not in self.scales or not self.is_adapter(name):
                if not with_base:
                    continue
                if layer is not None and layer in self.scales and name.endswith(BASE_WEIGHT):
                    yield self.hf_name(layer) + BASE, tensor
                else:
                    yield self.hf_name(name), tensor
                continue
            a = f".lora_A.{self.adapter}." in name
            yield self.hf_name(layer) + (FACTOR_A if a else FACTOR_B), tensor
            if layer in done:
                scale, transposed = self.scales[layer]
                yield self.hf_name(layer) + SCALE, scale_entry(scale, transposed)
            done.add(layer)

    def sync_specs(
        self, specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]], with_base: bool
    ) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """`sync_entries`' (name, dtype, shape), in its order, from the peft model's specs."""
        meta = ((name, torch.empty(shape, dtype=dtype, device="meta")) for name, dtype, shape in specs)
        return [(name, t.dtype, tuple(t.shape)) for name, t in self.sync_entries(meta, with_base)]

    def adapter_entries(
        self, entries: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The adapter's entries under peft's saved names (the whole stream is consumed: it may be
        collective)."""
        for name, tensor in entries:
            if self.is_adapter(name):
                yield self.saved_name(name), tensor


def adapter_modules(peft_model: torch.nn.Module, adapter: str) -> list[torch.nn.Module]:
    """The adapter's own linear modules (every adapted layer's lora_A and lora_B): FSDP1 makes each a
    unit of its own, so that no unit mixes frozen and trainable parameters."""
    from peft.tuners.lora import LoraLayer

    return [
        factor[adapter]
        for m in peft_model.modules()
        if isinstance(m, LoraLayer)
        for factor in (m.lora_A, m.lora_B)
        if adapter in factor
    ]


@contextmanager
def adapter_off(peft_model: Any) -> Iterator[None]:
    """The base model (LoRA's reference): peft's disable_adapter, the adapter's parameters left
    trainable. peft clears their requires_grad, and FSDP2 takes each unit's gradient dtypes from the
    parameters requiring grad at the model's first forward: a first forward here left bfloat16
    gradients uncast for float32 parameters ("a gradient with dtype BFloat16 ... grad_dtype Float")."""
    trained = [p for p in peft_model.parameters() if p.requires_grad]
    with peft_model.disable_adapter():
        for p in trained:
            p.requires_grad_(True)
        yield


def trainable(params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """What the optimizer steps: with LoRA only the adapter (the base is frozen)."""
    return [p for p in params if p.requires_grad]
