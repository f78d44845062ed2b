"""LoRA adapters resident in an engine beside its weights, unmerged, one chosen per request
(SamplingParams.adapter): one rollout worker serves its own weights and several LoRA adapters on
them, as vLLM serves `--lora-modules` (the door's `model` name, a Generate or RunTasks request's
sampling.adapter select one).

An adapter is a folder peft's save_pretrained wrote (adapter_config.json, adapter_model.safetensors),
loaded under a name. On the vLLM engine vLLM's own LoRA serving holds them (vllm.py); here, for the
HF engine, ResidentAdapters does. Its factors sit on the model's device in the model's dtype; while a request
with its name decodes, a forward hook on each adapted linear layer adds scale * B (A x) to the
layer's output, so the engine's own weights are never touched (a weight sync and adapters coexist:
an adapter applies to whatever base the engine holds). The same sum as the merged weight
W + scale * B @ A, in another order: outputs agree with a merged model's within rounding.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...core.lora_files import per_layer, read_factors, scale_of, unsupported

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
"""An adapter's name: what a request's `model` or sampling.adapter says."""


@dataclass
class Factors:
    a: torch.Tensor
    b: torch.Tensor
    scale: float


class AdapterNotHeld(KeyError):
    """A request or an unload names an adapter the engine does not hold (unloaded meanwhile)."""

    def __str__(self) -> str:
        return str(self.args[0])


def not_held(name: str, held: Iterable[str]) -> AdapterNotHeld:
    return AdapterNotHeld(f"adapter {name} is not loaded here (loaded: {', '.join(sorted(held)) or 'none'})")


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise ValueError(f"adapter name {name!r}: letters, digits and . _ : / - only, at most 128 characters")


def adapter_config(name: str, path: str) -> dict:
    """The adapter folder's adapter_config.json, checked to be a plain LoRA adapter (what every engine
    serves): ValueError in one line otherwise."""
    config_file = os.path.join(path, "adapter_config.json")
    if not (os.path.isfile(config_file) and os.path.isfile(os.path.join(path, "adapter_model.safetensors"))):
        raise ValueError(
            f"adapter {name}: '{path}' holds no adapter_config.json and adapter_model.safetensors "
            "(give a folder peft's save_pretrained wrote)"
        )
    try:
        with open(config_file) as f:
            config = json.load(f)
        rank = int(config["r"])
        float(config["lora_alpha"])
    except (ValueError, KeyError, TypeError) as e:  # not JSON, not an object, r or lora_alpha missing
        raise ValueError(
            f"adapter {name}: '{path}' has an adapter_config.json without a LoRA's r and lora_alpha ({e!r})"
        ) from None
    if rank < 1:
        raise ValueError(f"adapter {name}: '{path}' has rank r={rank}")
    beyond = unsupported(config) + per_layer(config)
    if beyond:
        raise ValueError(f"adapter {name}: '{path}' uses {', '.join(beyond)}; engines serve plain LoRA adapters")
    return config


def check_room(name: str, held: dict[str, str], limit: int) -> None:
    """ValueError in one line when adapter `name` would be one more than `limit` held."""
    if name not in held and len(held) >= limit:
        raise ValueError(
            f"adapter {name}: this engine holds {limit} adapters already ({', '.join(sorted(held)) or 'none'}); "
            "unload one first, or start it with room for more (--max-loras, engine_options.max_loras)"
        )


class ResidentAdapters:
    """The adapters one engine holds, at most `limit` of them, and the one its decoding uses now."""

    def __init__(self, model: torch.nn.Module, limit: int = 8):
        self.model, self.limit = model, limit
        self._linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        self._adapters: dict[str, dict[str, Factors]] = {}  # name -> module name -> factors
        self._paths: dict[str, str] = {}
        self._hooks: dict[str, torch.utils.hooks.RemovableHandle] = {}
        self._current: dict[str, Factors] | None = None
        self._lock = threading.Lock()

    def names(self) -> dict[str, str]:
        """Adapter name -> the folder it was loaded from."""
        return dict(self._paths)

    def load(self, name: str, path: str) -> None:
        """Load the peft adapter folder at `path` under `name` (replacing one of that name). Raises
        ValueError in one line for a bad name, folder or adapter, or past the limit."""
        check_name(name)
        check_room(name, self._paths, self.limit)
        factors = self._read(name, path)
        with self._lock:
            self._adapters[name], self._paths[name] = factors, path
            for module in factors:
                if module not in self._hooks:
                    self._hooks[module] = self._linears[module].register_forward_hook(self._hook(module))

    def unload(self, name: str) -> None:
        if name not in self._adapters:
            raise not_held(name, self._paths)
        with self._lock:
            del self._adapters[name], self._paths[name]
            used = {m for factors in self._adapters.values() for m in factors}
            for module in [m for m in self._hooks if m not in used]:
                self._hooks.pop(module).remove()

    @contextmanager
    def active(self, name: str) -> Iterator[None]:
        """Decode with adapter `name` (empty: the engine's own weights alone). KeyError in one line
        for a name not loaded."""
        if not name:
            yield
            return
        factors = self._adapters.get(name)
        if factors is None:
            raise not_held(name, self._paths)
        self._current = factors
        try:
            yield
        finally:
            self._current = None

    def _hook(self, module: str):
        def add(_: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            current = self._current
            f = None if current is None else current.get(module)
            if f is None:
                return None
            return out + F.linear(F.linear(args[0], f.a), f.b) * f.scale

        return add

    def _read(self, name: str, path: str) -> dict[str, Factors]:
        """The adapter at `path` as factors by module name, checked against the model."""
        config = adapter_config(name, path)
        rank = int(config["r"])
        scale = scale_of(config)
        try:
            pairs = read_factors(os.path.join(path, "adapter_model.safetensors"))
        except (ValueError, OSError) as e:
            raise ValueError(f"adapter {name}: '{path}' {e}") from None
        weight = next(iter(self.model.parameters()))
        head: Any = getattr(self.model, "get_output_embeddings", lambda: None)()
        tied = head is not None and head.weight is self.model.get_input_embeddings().weight  # type: ignore[operator]
        out: dict[str, Factors] = {}
        for module, (a, b) in pairs.items():
            linear = self._linears.get(module)
            if linear is None:
                raise ValueError(f"adapter {name}: '{path}' adapts {module}, which is no linear layer of this model")
            if tied and linear is head:  # merged, it would move the embedding too: served, it could not
                raise ValueError(f"adapter {name}: '{path}' adapts {module}, which shares its weight with the embedding")
            if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
                raise ValueError(
                    f"adapter {name}: '{path}' does not fit this model at {module} (A {tuple(a.shape)}, "
                    f"B {tuple(b.shape)}; the layer is {linear.out_features}x{linear.in_features})"
                )
            out[module] = Factors(a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype), scale)
        return out
