"""What serving a LoRA adapter unmerged costs: the HF engine decoding with a resident adapter (its hooks
add scale * B (A x) on every adapted layer, rollout/engines/adapters.py) against the same engine on
its own weights, which is what the adapter merged into the weights costs.

Per model shape (random weights, float32, built here; a rank `--rank` adapter with random B on every
linear layer but the head) one engine decodes the same greedy batch (`--prompts` prompts of 8 tokens,
`--tokens` new tokens each) with and without the adapter, the two sides alternating, `--repeats`
times; the ratio of their times is taken within each repeat (machines drift), min/median/max over
the repeats. Decoding on the CPU, with torch's threads.

    rlcore bench resident-adapters                      # quickstart and a 26M Llama; rank 16
    rlcore bench resident-adapters --models small --rank 64 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import comma_names, positive_int
from rlcore.benchmarks.common import default_out, machine_info, pyplot, save_figure, versions, write_outputs

SHAPES: dict[str, dict[str, Any]] = {
    "quickstart": {"hidden_size": 128, "num_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 384},
    "small": {"hidden_size": 512, "num_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
              "intermediate_size": 1536},
}  # fmt: skip
"""Llama shapes: the quickstart's scratch model, and a 26M one (a byte-level vocabulary of 512)."""


def _build(folder: str, name: str, rank: int) -> str:
    """The model shape `name` in `folder`/model and a rank `rank` adapter with random B in
    `folder`/adapter; returns the model's folder."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    model_path = os.path.join(folder, "model")
    build_scratch_model(model_path, ScratchModelConfig(enabled=True, tokenizer="bpe", **SHAPES[name]), 512, seed=0)
    torch.manual_seed(0)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"),
    )
    with torch.no_grad():
        for param_name, p in peft_model.named_parameters():
            if "lora_B" in param_name:
                p.normal_(std=0.02)
    peft_model.save_pretrained(os.path.join(folder, "adapter"))
    return model_path


def measure_model(name: str, rank: int, prompts: int, tokens: int, repeats: int) -> dict[str, Any]:
    """Seconds per decode of the batch with and without the adapter, alternating, and their ratios."""
    from rlcore.core.types import SamplingParams
    from rlcore.rollout.engines.hf import HFEngine

    with tempfile.TemporaryDirectory() as folder:
        engine = HFEngine(_build(folder, name, rank), max_model_len=512)
        engine.load_adapter("bench", os.path.join(folder, "adapter"))
        batch = [[(7 * i + j) % 256 + 1 for j in range(8)] for i in range(prompts)]
        sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        parameters = sum(p.numel() for p in engine.model.parameters())

        def timed(adapter: str) -> float:
            start = time.perf_counter()
            engine.generate(batch, SamplingParams(**{**sampling.__dict__, "adapter": adapter}))
            return time.perf_counter() - start

        timed(""), timed("bench")  # warm-up: the first decode of each side allocates
        times: dict[str, list[float]] = {"merged": [], "adapter": []}
        for i in range(repeats):
            for side in ("merged", "adapter") if i % 2 == 0 else ("adapter", "merged"):
                times[side].append(timed("bench" if side == "adapter" else ""))
    ratios = [a / m for a, m in zip(times["adapter"], times["merged"], strict=True)]
    return {
        "model": name, "parameters": parameters, "rank": rank, "prompts": prompts, "tokens": tokens,
        "seconds": times, "ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    rows = [
        f"| {r['model']} | {r['parameters'] / 1e6:,.1f}M | {r['rank']} | {r['prompts']} x {r['tokens']} | "
        f"{statistics.median(r['seconds']['merged']):.2f} | {statistics.median(r['seconds']['adapter']):.2f} | "
        f"{r['ratio']['median']:.2f}x ({r['ratio']['min']:.2f}-{r['ratio']['max']:.2f}) |"
        for r in result["models"]
    ]
    return "\n".join([
        "Greedy decoding on the HF engine (CPU) with a resident LoRA adapter, unmerged, against its own "
        "weights (what the adapter merged costs): an adapter on every linear layer but the head, "
        "alpha 2 x rank; the two sides alternate, the ratio is taken within each repeat.",
        "",
        "| model | parameters | rank | prompts x tokens | merged, s | adapter, s | adapter / merged (min-max) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])  # fmt: skip


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    models = [r["model"] for r in result["models"]]
    medians = [r["ratio"]["median"] for r in result["models"]]
    errors = [
        [m - r["ratio"]["min"] for m, r in zip(medians, result["models"], strict=True)],
        [r["ratio"]["max"] - m for m, r in zip(medians, result["models"], strict=True)],
    ]
    ax.bar(models, medians, yerr=errors, capsize=4)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("decode time, adapter / merged")
    ax.set_title("A resident LoRA adapter, unmerged, on the HF engine")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlcore bench resident-adapters", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__.split("\n\n")[0],
    )  # fmt: skip
    parser.add_argument("--models", default=",".join(SHAPES), help=f"model shapes, comma-separated ({', '.join(SHAPES)})")
    parser.add_argument("--rank", type=positive_int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--prompts", type=positive_int, default=8, help="prompts decoded together")
    parser.add_argument("--tokens", type=positive_int, default=64, help="new tokens per prompt")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed decodes per side")
    parser.add_argument("--out", default=default_out("resident_adapters.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    models = comma_names(parser, "--models", args.models, tuple(SHAPES))
    result = {
        "models": [measure_model(n, args.rank, args.prompts, args.tokens, args.repeats) for n in models],
        "machine": machine_info(),
        "versions": versions(),
    }
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
