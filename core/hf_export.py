"""Export the strategy's weights as an HF model folder loadable by `from_pretrained`, and a LoRA
adapter as peft saves one.

Weights arrive one full tensor at a time from `iter_full_weights()` and are written in safetensors
shards of bounded size, so the writer never holds the whole model.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

SHARD_BYTES = 2 * 1024**3
HF_DIR = "hf"
"""A checkpoint's HF export (trainer.save_hf_checkpoint; with LoRA the merged model)."""
ADAPTER_DIR = "adapter"
"""A checkpoint's LoRA adapter in peft's format (every checkpoint of a LoRA run)."""


def export_hf(
    weights: Iterable[tuple[str, torch.Tensor]],
    out_dir: str,
    hf_config: Any,
    tokenizer_dir: str,
    write: bool,
    shard_bytes: int = SHARD_BYTES,
) -> None:
    """Consume `weights` (every rank must, it is collective); rank with `write=True` writes files."""
    from safetensors.torch import save_file

    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    shard: dict[str, torch.Tensor] = {}
    shard_size = 0
    files: list[tuple[str, list[str]]] = []

    def flush() -> None:
        nonlocal shard, shard_size
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name), metadata={"format": "pt"})
        files.append((name, list(shard)))
        shard, shard_size = {}, 0

    iterator = iter(weights)
    try:
        if write:
            os.makedirs(out_dir, exist_ok=True)
        for name, tensor in iterator:
            if not write or (tied and name == "lm_head.weight"):
                continue
            t = tensor.detach().to("cpu", copy=True).contiguous()
            if shard and shard_size + t.numel() * t.element_size() > shard_bytes:
                flush()
            shard[name] = t
            shard_size += t.numel() * t.element_size()
    except OSError:
        for _ in iterator:  # a failed write (a full disk): the other ranks still gather every tensor
            pass
        raise
    if not write:
        return
    if shard or not files:
        flush()
    if len(files) == 1:
        os.replace(os.path.join(out_dir, files[0][0]), os.path.join(out_dir, "model.safetensors"))
    else:
        index = {"metadata": {}, "weight_map": {k: fname for fname, keys in files for k in keys}}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    config = copy.deepcopy(hf_config)
    config.use_cache = True  # training turns the KV cache off; inference wants it
    config.save_pretrained(out_dir)
    for fname in os.listdir(tokenizer_dir):
        if fname.startswith("tokenizer") or fname in (
            "special_tokens_map.json",
            "generation_config.json",
            "chat_template.jinja",
        ):
            shutil.copy2(os.path.join(tokenizer_dir, fname), os.path.join(out_dir, fname))


ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def export_adapter(
    weights: Iterable[tuple[str, torch.Tensor]], out_dir: str, adapter_config: dict[str, Any], write: bool
) -> None:
    """A LoRA adapter as peft saves one (adapter_config.json, adapter_model.safetensors: loads with
    `PeftModel.from_pretrained(base, out_dir)`). Consumes `weights` on every rank (collective); the
    rank with `write=True` writes. The adapter is small: it is written in one file."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in weights}
    if not write:
        return
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(out_dir, ADAPTER_CONFIG), "w") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)
