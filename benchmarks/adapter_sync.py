"""Bytes a LoRA run's weight sync carries: merged weights against the adapter alone
(synchronizer.lora_sync; weights/adapter.py), for the quickstart's model and real shapes.

Per model (built on the meta device: no memory, nothing downloaded; float32 master weights, as the
trainer holds them) a rank `--rank` adapter (alpha 2 x rank) goes on every linear layer, and the
bytes each sync announces are summed from the specs the trainer's own LoRA layout gives:

    merged         every sync with lora_sync merged (the HF model's weights, adapter merged in)
    adapter_first  a transport's first sync with lora_sync adapter (every weight, the adapted
                   layers' bases, then the factors and scales)
    adapter        every later sync: each adapted layer's A, B and scale

The counts are exact, not timed: what goes over the wire (or into a checkpoint folder) per sync.
The time a sync takes follows its bytes over a given link (`rlcore bench weight-sync` measures
rlcore's bandwidth against the wire's).

    rlcore bench adapter-sync                         # quickstart, qwen2-0.5b, qwen2-7b; rank 16
    rlcore bench adapter-sync --models qwen2-0.5b --rank 64
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rlcore.benchmarks.cli_args import comma_names, positive_int
from rlcore.benchmarks.common import default_out, machine_info, pyplot, save_figure, versions, write_outputs

SHAPES: dict[str, dict[str, Any]] = {
    "quickstart": {"architectures": "llama", "vocab_size": 96, "hidden_size": 128, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 384,
                   "tie_word_embeddings": False},
    "qwen2-0.5b": {"architectures": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
                   "tie_word_embeddings": True},
    "qwen2-7b": {"architectures": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                 "tie_word_embeddings": False},
}  # fmt: skip
"""Model shapes: the quickstart's scratch Llama (char tokenizer), Qwen2-0.5B's and Qwen2-7B's (their
config.json's sizes)."""
SYNCS = ("merged", "adapter_first", "adapter")


def _bytes(specs: list[tuple[str, Any, tuple[int, ...]]]) -> int:
    import math

    return sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in specs)


def measure_model(name: str, rank: int) -> dict[str, Any]:
    """The bytes of each kind of sync (SYNCS) for model `name` with a rank `rank` adapter."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from rlcore.backends.common.lora import LoraLayout, apply_lora
    from rlcore.core.config.schema import LoraConfig

    shape = dict(SHAPES[name])
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[shape.pop("architectures")]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_class(**shape), dtype=torch.float32)
        peft_model = apply_lora(model, LoraConfig(lora_rank=rank, lora_alpha=2 * rank), seed=0)
    layout = LoraLayout.of(peft_model, "default")
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in peft_model.state_dict().items()]
    adapter = [s for s in specs if layout.is_adapter(s[0])]
    sizes = {
        "merged": _bytes(layout.specs(specs)),
        "adapter_first": _bytes(layout.sync_specs(specs, with_base=True)),
        "adapter": _bytes(layout.sync_specs(adapter, with_base=False)),
    }
    return {
        "model": name, "rank": rank, "parameters": sum(p.numel() for p in model.parameters()),
        "adapted_layers": len(layout.scales), "bytes": sizes, "ratio": sizes["merged"] / sizes["adapter"],
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    rows = [
        f"| {r['model']} | {r['parameters'] / 1e6:,.1f}M | {r['rank']} | {r['adapted_layers']} | "
        f"{r['bytes']['merged'] / 1e6:,.2f} | {r['bytes']['adapter_first'] / 1e6:,.2f} | "
        f"{r['bytes']['adapter'] / 1e6:,.3f} | {r['ratio']:,.1f}x |"
        for r in result["models"]
    ]
    return "\n".join([
        "Bytes per weight sync of a LoRA run (float32 master weights, an adapter on every linear layer, "
        "alpha 2 x rank), counted from the trainer's LoRA layout: merged weights every sync against the "
        "adapter alone (after a transport's first sync, which carries the base too).",
        "",
        "| model | parameters | rank | adapted layers | merged, MB | adapter, first sync, MB | adapter, MB | "
        "merged / adapter |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])  # fmt: skip


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    models = [r["model"] for r in result["models"]]
    width = 0.27
    for i, sync in enumerate(SYNCS):
        xs = [j + (i - 1) * width for j in range(len(models))]
        ax.bar(xs, [r["bytes"][sync] / 1e6 for r in result["models"]], width, label=sync.replace("_", ", "))
    ax.set_xticks(range(len(models)), models)
    ax.set_yscale("log")
    ax.set_ylabel("MB per sync (log)")
    ax.set_title("LoRA weight sync: merged weights against the adapter alone")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlcore bench adapter-sync", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__.split("\n\n")[0],
    )  # fmt: skip
    parser.add_argument("--models", default=",".join(SHAPES), help=f"model shapes, comma-separated ({', '.join(SHAPES)})")
    parser.add_argument("--rank", type=positive_int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--out", default=default_out("adapter_sync.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    models = comma_names(parser, "--models", args.models, tuple(SHAPES))
    result = {
        "models": [measure_model(name, args.rank) for name in models],
        "machine": machine_info(),
        "versions": versions(),
    }
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
