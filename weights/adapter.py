"""Adapter-only weight sync (synchronizer.lora_sync adapter): with LoRA the base weights never change,
so after a stage's first sync the trainer sends each adapted layer's factors A and B and its scale
instead of the merged weight, and the engine merges them into the base weight it kept. A rank-16
adapter of a 7B model is about 40 MB against 15 GB of merged weights.

On the wire (every transport: a process group's buckets, a checkpoint folder, an in-process copy)
an adapted layer `L` (its HF name, e.g. `model.layers.0.self_attn.q_proj`) is

    L.lora_base       its base weight W0 (the first sync of a transport only)
    L.lora_A.weight   [r, in]
    L.lora_B.weight   [out, r]
    L.lora_scale      float64 [2]: alpha / r, and 1.0 where the layer stores its weight transposed
                      (GPT-2's Conv1D), else 0.0

The first sync also carries every weight no adapter touches, as a merged sync would, so an engine
that held other weights (an earlier stage's) holds the stage's base. The engine loads `L.weight` =
W0 + (B @ A) x scale (transposed where marked), computed where the factors arrive: the same sum, in
the same order and dtypes, as the trainer's merged view (backends/common/lora.py LoraLayout.merged),
so it holds the weights a merged sync would give it (bit for bit where both compute on the same kind
of device; B @ A on a GPU and a CPU may differ in the last bit). It keeps each W0 on the CPU until a
sync brings another one or a plain `L.weight`; a sync of factors for a layer whose base it lacks (a
restarted worker) fails in one line, and the trainer's next sync, over a new transport, starts with
the bases again (on every trainer rank: TrainerWorld.sync_weights agrees it over them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch

BASE, FACTOR_A, FACTOR_B, SCALE = ".lora_base", ".lora_A.weight", ".lora_B.weight", ".lora_scale"
PARTS = (FACTOR_A, FACTOR_B, SCALE)


class AdapterHolder(Protocol):
    """A strategy training a LoRA adapter (backends/common/native.py)."""

    def adapter_sync_specs(self, with_base: bool) -> list[tuple[str, torch.dtype, tuple[int, ...]]]: ...

    def iter_adapter_sync(self, with_base: bool) -> Iterator[tuple[str, torch.Tensor]]: ...

    def hf_config(self) -> Any: ...


class AdapterSource:
    """A WeightSource whose weights are the adapter's sync entries (the module's docstring), with the
    base (`with_base`: a transport's first sync) or without: what a transport sends in place of the
    merged weights."""

    def __init__(self, strategy: AdapterHolder, with_base: bool):
        self.strategy, self.with_base = strategy, with_base

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return self.strategy.adapter_sync_specs(self.with_base)

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.strategy.iter_adapter_sync(self.with_base)

    def hf_config(self) -> Any:
        return self.strategy.hf_config()


def scale_entry(scale: float, transposed: bool) -> torch.Tensor:
    return torch.tensor([scale, 1.0 if transposed else 0.0], dtype=torch.float64)


def merge_adapters(
    weights: Iterable[tuple[str, torch.Tensor]], bases: dict[str, torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` as an engine loads them: each adapted layer's factors and scale replaced by its
    merged weight once all three have come, over the base `bases` holds (a `L.lora_base` entry
    stores one there, a plain `L.weight` drops it); every other entry as it comes."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        if name.endswith(BASE):
            bases[name[: -len(BASE)]] = tensor.detach().to("cpu", copy=True)
            continue
        part = next((p for p in PARTS if name.endswith(p)), None)
        if part is None:
            if name.endswith(".weight"):
                bases.pop(name[: -len(".weight")], None)
            yield name, tensor
            continue
        layer = name[: -len(part)]
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) < len(PARTS):
            continue
        del pending[layer]
        w0 = bases.get(layer)
        if w0 is None:
            raise ValueError(f"adapter sync: no base weight of {layer} here to merge its adapter into (the sync "
                             "that carries the bases did not reach this engine); the next sync sends them")  # fmt: skip
        scale, transposed = parts[SCALE].tolist()
        delta = (parts[FACTOR_B].float() @ parts[FACTOR_A].float()) * scale  # where the factors came (the engine's device)
        delta = delta.T if transposed else delta
        yield layer + ".weight", w0.to(delta.device) + delta.to(w0.dtype)
    if pending:
        layer, parts = next(iter(pending.items()))
        missing = [p.lstrip(".") for p in PARTS if p not in parts]
        raise ValueError(f"adapter sync: layer {layer} never got its {', '.join(missing)}")
