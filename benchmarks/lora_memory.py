"""LoRA and offloading against full fine-tuning: the trainer's peak memory and step time, KL on.

Each side is a fresh process holding a one-rank trainer world (gloo on CPU; NCCL beside gloo on CUDA, as the trainer world) that
takes --steps steps through the trainer's own path (StageTraining.train_sequences with GRPO's
policy loss and a k3 KL term, then its optimizer step) on --seqs random sequences of --prompt-tokens
+ --response-tokens, on a scratch Llama of about 113M parameters (--hidden 768, --layers 12).
Full fine-tuning holds float32 master weights, their gradients, AdamW's two moments and a frozen
reference copy for the KL term; LoRA holds the frozen base once, the adapter with its gradients
and moments, and takes the reference by switching the adapter off. The `offload` side (--sides full,lora,offload)
is full fine-tuning with the policy's shards and the reference on the CPU
(trainer.fsdp_config.param_offload, trainer.offload_untrained_models): the device memory it saves.

Reported per side, over --repeats runs in alternating order: peak memory (CPU: the process's
ru_maxrss, and that less the resident memory just before the trainer was built; CUDA: the
allocator's peak), the resident memory the trainer holds after its last step, the median step time
after the first step, and each side's ratio to full fine-tuning per repeat (min / median / max).

    rlcore bench lora                       # 2 repeats, 113M parameters, rank 16 on every linear layer
    rlcore bench lora --repeats 1 --hidden 128 --layers 2 --steps 2 --out /tmp/lora.json
    rlcore bench lora --device cuda --model 0.5b     # bf16 on a GPU, Qwen2-0.5B's shape
    rlcore bench lora --device cuda --model 0.5b --sides full,lora,offload
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import add_device_args, check_device, positive_int, resolved_dtype
from rlcore.benchmarks.common import (
    MODELS,
    build_scratch,
    default_out,
    machine_info,
    machine_line,
    one_rank_world,
    pyplot,
    rss_gib,
    run_helper,
    run_sides,
    save_figure,
    scratch_shape,
    spread,
    versions,
    write_outputs,
)

SIDES = ("full", "lora", "offload")
OLD_LOGPROB = -4.0
"""The behaviour policy's log-prob of every response token (about a uniform choice among the char
tokenizer's 87 tokens): the ratio and its clip then work as on real rollouts."""


# ---------------------------------------------------------------------------- one side, one process


def run_side(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: a one-rank world, the trainer of one side, --steps steps."""
    import torch
    import torch.distributed as dist

    from rlcore.core.config.schema import LoraConfig, RLCoreConfig
    from rlcore.runtime.training import StageTraining, sequence_spec

    cuda = args.device == "cuda"
    torch.set_num_threads(args.threads)
    one_rank_world(args.device)
    cfg = RLCoreConfig(seed=0)
    cfg.model.model_path = args.model_dir
    cfg.model.dtype = args.dtype
    cfg.algorithm.kl_loss_coef, cfg.algorithm.kl_loss_fn = 0.01, "k3"
    cfg.algorithm.optimizer.lr = 1e-5
    if args.side == "lora":
        cfg.model.lora_configs = [LoraConfig(lora_rank=args.rank, lora_alpha=2 * args.rank)]
    if args.side == "offload":
        cfg.trainer.fsdp_config.param_offload = cfg.trainer.offload_untrained_models = True
    gen = torch.Generator().manual_seed(0)
    specs = [
        sequence_spec(
            torch.randint(4, 80, (args.prompt_tokens,), generator=gen).tolist(),
            torch.randint(4, 80, (args.response_tokens,), generator=gen).tolist(),
            [],
            [1.0 if i % 2 else -1.0],
            [OLD_LOGPROB] * args.response_tokens,
        )  # fmt: skip
        for i in range(args.seqs)
    ]
    import peft  # noqa: F401  (the code both sides load, loaded before the baseline)
    import transformers.models.llama.modeling_llama  # noqa: F401

    base_gib = rss_gib()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as stage_dir:
        training = StageTraining(cfg, stage_dir, args.model_dir, args.device, args.steps)
        trained = sum(p.numel() for p in training.strategy.model.parameters() if p.requires_grad)
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            out = training.train_sequences(specs, "grpo", 1.0, 0.0)
            training.optimizer_step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        held_gib = rss_gib() - base_gib  # the trainer's state after its steps (no load transients)
        cuda_held_gib = torch.cuda.memory_allocated() / 2**30 if cuda else 0.0
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    result = {
        "side": args.side,
        "trained_params": trained,
        "peak_rss_gib": peak_gib,
        "rss_before_trainer_gib": base_gib,
        "trainer_peak_gib": peak_gib - base_gib,
        "trainer_held_gib": held_gib,
        "step_s": statistics.median(times[1:] or times),
        "kl_loss": float(out["metrics"].get("actor/kl_loss", 0.0)),
    }
    if cuda:
        result["cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["cuda_held_gib"] = cuda_held_gib
    dist.destroy_process_group()
    return result


# ---------------------------------------------------------------------------- the benchmark


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    model = os.path.join(workdir, "model")
    params = build_scratch(model, args, args.prompt_tokens + args.response_tokens)
    print(f"lora: {params / 1e6:.0f}M parameters, {args.seqs} x ({args.prompt_tokens} + {args.response_tokens}) "
          f"tokens per step, {args.steps} steps, {args.repeats} repeats", flush=True)  # fmt: skip

    def one(side: str, rep: int) -> dict[str, Any]:
        out = os.path.join(workdir, f"{side}-{rep}.json")
        cmd = [sys.executable, "-m", "rlcore.benchmarks.lora_memory", "--side", side, "--model-dir", model,
               "--side-out", out, *args.passthrough]  # fmt: skip
        return dict(run_helper(cmd, out, args.run_timeout, f"the {side} side"))

    def describe(r: dict[str, Any]) -> str:
        return f"trainer peak {r['trainer_peak_gib']:.2f} GiB, step {r['step_s']:.2f} s"

    runs = run_sides(args.sides, args.repeats, one, describe)
    keys = ["trainer_peak_gib", "trainer_held_gib", "peak_rss_gib", "step_s"]
    keys += ["cuda_peak_gib", "cuda_held_gib"] if "cuda_peak_gib" in runs["full"][0] else []
    ratios = {
        f"{side}_over_full": {
            key: spread([r[key] / fu[key] for fu, r in zip(runs["full"], runs[side], strict=True)])
            for key in keys
        }
        for side in args.sides[1:]
    }
    return {
        "benchmark": "lora",
        "machine": machine_info(),
        "versions": versions(),
        "params": params,
        "settings": {k: v for k, v in vars(args).items() if k not in ("passthrough",)},
        "shape": scratch_shape(args),
        "runs": runs,
        **ratios,
    }


def markdown(result: dict[str, Any]) -> str:
    s, runs = result["settings"], result["runs"]
    cuda = "cuda_peak_gib" in runs["full"][0]
    shape = result.get("shape") or {"num_layers": s["layers"], "hidden_size": s["hidden"]}
    lines = [
        f"# {' and '.join(s['sides'][1:])} against full fine-tuning: trainer memory and step time "
        f"({'CUDA' if cuda else 'CPU'})",
        "",
        f"{result['params'] / 1e6:.0f}M-parameter scratch Llama ({shape['num_layers']} layers, hidden "
        f"{shape['hidden_size']}), {s.get('dtype', 'float32')} on {machine_line(result['machine'])}; "
        f"KL on (k3, reference model), {s['seqs']} sequences x ({s['prompt_tokens']} + {s['response_tokens']}) "
        f"tokens per step, {s['steps']} steps per run; LoRA rank {s['rank']} on every linear layer; offload: "
        "the policy's shards and the reference on the CPU (fsdp2's CPUOffloadPolicy). "
        f"{s['repeats']} repeats, sides alternating, each a fresh process. Trainer peak = the process's "
        "peak resident memory less its resident memory just before the trainer was built; trainer held = "
        "its resident memory after the last step, less the same (the state it keeps, without the load's "
        "transients)."
        + (
            " CUDA peak allocated = the caching allocator's peak from the trainer's build to its last step; CUDA "
            "held = what stays allocated after it."
            if cuda
            else ""
        ),
        "",
        "| side | trained parameters | trainer peak GiB | trainer held GiB | process peak GiB | "
        + ("CUDA peak allocated GiB | CUDA held GiB | " if cuda else "")
        + "step s (median) |",
        "|---|---|---|---|---|" + ("---|---|" if cuda else "") + "---|",
    ]
    for side in s["sides"]:
        rs = runs[side]
        lines.append(
            f"| {side} | {rs[0]['trained_params'] / 1e6:.2f}M | "
            f"{statistics.median(r['trainer_peak_gib'] for r in rs):.2f} | "
            f"{statistics.median(r['trainer_held_gib'] for r in rs):.2f} | "
            f"{statistics.median(r['peak_rss_gib'] for r in rs):.2f} | "
            + (f"{statistics.median(r['cuda_peak_gib'] for r in rs):.2f} | " if cuda else "")
            + (f"{statistics.median(r['cuda_held_gib'] for r in rs):.2f} | " if cuda else "")
            + f"{statistics.median(r['step_s'] for r in rs):.2f} |"
        )
    for side in s["sides"][1:]:
        lines += ["", f"{side} / full per repeat (min / median / max):", ""]
        for key, sp in result[f"{side}_over_full"].items():
            lines.append(f"- {key}: {sp['min']:.3f} / {sp['median']:.3f} / {sp['max']:.3f}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    sides = result["settings"]["sides"]
    cuda = "cuda_peak_gib" in result["runs"]["full"][0]
    peak = ("cuda_peak_gib", "CUDA peak allocated GiB") if cuda else ("trainer_peak_gib", "trainer peak GiB")
    for ax, (key, label) in zip(axes, (peak, ("step_s", "step s")), strict=True):
        values = [statistics.median(r[key] for r in result["runs"][side]) for side in sides]
        ax.bar(sides, values, color=["tab:gray", "tab:blue", "tab:orange"][: len(sides)])
        ax.set_title(label)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=positive_int, default=2, help="measured repeats of each side")
    parser.add_argument(
        "--sides", default="full,lora",
        help=f"comma-separated sides, full first (of {', '.join(SIDES)})",
    )  # fmt: skip
    parser.add_argument(
        "--steps", type=positive_int, default=4, help="steps per run (the first is not timed)"
    )
    parser.add_argument("--hidden", type=positive_int, default=768, help="the model's hidden size")
    parser.add_argument("--layers", type=positive_int, default=12, help="the model's layers")
    parser.add_argument("--heads", type=positive_int, default=12, help="the model's attention heads")
    parser.add_argument("--rank", type=positive_int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--seqs", type=positive_int, default=8, help="sequences per training batch")
    parser.add_argument("--prompt-tokens", type=positive_int, default=16, help="prompt tokens per sequence")
    parser.add_argument(
        "--response-tokens", type=positive_int, default=48, help="response tokens per sequence"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads per side")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one side may take")
    parser.add_argument("--out", default=default_out("lora.json"), help="where the JSON result goes")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a side's own process
    parser.add_argument(
        "--model", default=None, choices=tuple(MODELS),
        help="a named scratch shape (overrides --hidden, --layers and --heads)",
    )  # fmt: skip
    add_device_args(parser)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--side-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    args.dtype = resolved_dtype(args)
    if args.hidden % args.heads:
        parser.error("--hidden must be divisible by --heads")
    args.sides = tuple(args.sides.split(","))
    if args.sides[0] != "full" or len(args.sides) < 2 or not set(args.sides) <= set(SIDES):
        parser.error(f"--sides: full first, then one or more of lora, offload; got {','.join(args.sides)}")
    if args.side is not None:
        with open(args.side_out, "w") as f:
            json.dump(run_side(args), f)
        return 0
    args.passthrough = [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in ("steps", "rank", "seqs", "prompt_tokens", "response_tokens", "threads", "device", "dtype")
    ]
    with tempfile.TemporaryDirectory(prefix="rlcore-lora-") as workdir:
        result = measure(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
