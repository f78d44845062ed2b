"""Sequence packing against padding on a long tail of response lengths: train tokens/s and memory.

A step's responses are mostly short (--short, uniform) with one in --long-every long (--long): a
reasoning run's tail. Each side is a fresh process holding a one-rank trainer world (gloo on CPU;
NCCL beside gloo on CUDA, as the trainer world) that takes --steps GRPO steps through the trainer's
own path (StageTraining.train_sequences with the policy loss, then its optimizer step) on the same
--seqs sequences, under the same micro-batch budget (--max-tokens, trainer.max_token_len_per_gpu):

    padded            trainer.use_remove_padding false, balance_batch false: rows padded to the
                      micro-batch's longest, micro-batches in rollout order (rlcore before packing)
    padded-by-length  padded, but micro-batches grouped by length (balance_batch)
    packed            the defaults: each micro-batch's real tokens end to end, no padding

Reported per side, over --repeats runs in alternating order: train tokens/s (the real tokens of a
step over its median time after the first step), the tokens the forward computes (padding
included), micro-batches per step, peak memory (CPU: the process's ru_maxrss less its resident
memory just before the trainer was built; CUDA: the allocator's peak), and each side's ratio to
`padded` per repeat (min / median / max).

    rlcore bench packing                        # 2 repeats, 25M parameters, 48 x (16 + 32..128, 1 in 12 1..2k)
    rlcore bench packing --repeats 1 --hidden 64 --layers 2 --seqs 8 --long 64,128 --steps 2
    rlcore bench packing --device cuda --model 0.5b --long 4096,8192 --max-tokens 32768
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
    mfu,
    one_rank_world,
    pyplot,
    rss_gib,
    run_helper,
    run_sides,
    save_figure,
    spread,
    versions,
    write_outputs,
)

SIDES = ("padded", "padded-by-length", "packed")
FLAGS = {"padded": (False, False), "padded-by-length": (False, True), "packed": (True, True)}
"""side -> (trainer.use_remove_padding, trainer.balance_batch)."""
OLD_LOGPROB = -4.0
"""The behaviour policy's log-prob of every response token (about uniform over the char tokenizer)."""


def lengths(args: argparse.Namespace) -> list[int]:
    """Each sequence's response length: one in --long-every from --long, the rest from --short."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(args.seqs):
        lo, hi = args.long if i % args.long_every == args.long_every - 1 else args.short
        out.append(int(torch.randint(lo, hi + 1, (), generator=gen)))
    return out


def computed_tokens(args: argparse.Namespace, side: str) -> tuple[int, int]:
    """(tokens the forwards compute per step, micro-batches per step) as the trainer plans them."""
    from rlcore.core.batch import Sequence, plan_micro_batches

    packed, by_length = FLAGS[side]
    seqs = [Sequence([0] * args.prompt_tokens, [0] * n) for n in lengths(args)]
    groups = plan_micro_batches(seqs, args.max_tokens, packed=packed, by_length=by_length)
    size = sum(sum(s.length for s in g) if packed else len(g) * max(s.length for s in g) for g in groups)
    return size, len(groups)


# ---------------------------------------------------------------------------- one side, one process


def run_side(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: a one-rank world, the trainer with this side's flags, --steps steps."""
    import torch
    import torch.distributed as dist

    from rlcore.core.config.schema import RLCoreConfig
    from rlcore.runtime.training import StageTraining, sequence_spec

    cuda = args.device == "cuda"
    torch.set_num_threads(args.threads)
    one_rank_world(args.device)
    cfg = RLCoreConfig(seed=0)
    cfg.model.model_path, cfg.model.dtype = args.model_dir, args.dtype
    cfg.algorithm.optimizer.lr = 1e-5
    cfg.trainer.max_token_len_per_gpu = args.max_tokens
    cfg.trainer.use_remove_padding, cfg.trainer.balance_batch = FLAGS[args.side]
    gen = torch.Generator().manual_seed(0)
    specs = [
        sequence_spec(
            torch.randint(4, 80, (args.prompt_tokens,), generator=gen).tolist(),
            torch.randint(4, 80, (n,), generator=gen).tolist(),
            [],
            [1.0 if i % 2 else -1.0],
            [OLD_LOGPROB] * n,
        )  # fmt: skip
        for i, n in enumerate(lengths(args))
    ]
    import transformers.models.llama.modeling_llama  # noqa: F401  (loaded before the baseline)

    base_gib = rss_gib()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as stage_dir:
        training = StageTraining(cfg, stage_dir, args.model_dir, args.device, args.steps)
        times, losses = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            out = training.train_sequences(specs, "grpo", 1.0, 0.0)
            training.optimizer_step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(float(out["loss"]))
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    step_s = statistics.median(times[1:] or times)
    tokens = sum(len(s.prompt) + len(s.response) for s in specs)
    result = {
        "side": args.side,
        "tokens": tokens,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "trainer_peak_gib": peak_gib - base_gib,
        "losses": losses,
    }
    if cuda:
        result["cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    dist.destroy_process_group()
    return result


# ---------------------------------------------------------------------------- the benchmark


RATIO_KEYS = ("tokens_per_s", "trainer_peak_gib", "cuda_peak_gib")


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    model = os.path.join(workdir, "model")
    params = build_scratch(model, args, args.prompt_tokens + args.long[1])
    lens = lengths(args)
    print(f"packing: {params / 1e6:.1f}M parameters, {args.seqs} sequences of {args.prompt_tokens} + "
          f"{min(lens)}..{max(lens)} tokens ({sum(lens) + args.seqs * args.prompt_tokens} per step), "
          f"budget {args.max_tokens}, {args.steps} steps, {args.repeats} repeats", flush=True)  # fmt: skip

    def one(side: str, rep: int) -> dict[str, Any]:
        out = os.path.join(workdir, f"{side}-{rep}.json")
        cmd = [sys.executable, "-m", "rlcore.benchmarks.packing", "--side", side, "--model-dir", model,
               "--side-out", out, *args.passthrough]  # fmt: skip
        return dict(run_helper(cmd, out, args.run_timeout, f"the {side} side"))

    def describe(r: dict[str, Any]) -> str:
        return f"{r['tokens_per_s']:.0f} tokens/s, trainer peak {r['trainer_peak_gib']:.2f} GiB"

    runs = run_sides(SIDES, args.repeats, one, describe, width=16)
    ratios = {
        side: {
            key: spread([r[key] / p[key] for p, r in zip(runs["padded"], runs[side], strict=True)])
            for key in RATIO_KEYS
            if key in runs[side][0]
        }
        for side in SIDES[1:]
    }
    planned = {side: dict(zip(("computed_tokens", "micro_batches"), computed_tokens(args, side), strict=True))
               for side in SIDES}  # fmt: skip
    return {
        "benchmark": "packing",
        "machine": machine_info(),
        "versions": versions(),
        "params": params,
        "settings": {k: v for k, v in vars(args).items() if k != "passthrough"},
        "lengths": lens,
        "planned": planned,
        "runs": runs,
        "over_padded": ratios,
    }


def markdown(result: dict[str, Any]) -> str:
    s, runs, lens = result["settings"], result["runs"], result["lengths"]
    cuda = "cuda_peak_gib" in runs["padded"][0]
    real = runs["padded"][0]["tokens"]
    lines = [
        f"# Sequence packing against padding on a long tail ({'CUDA' if cuda else 'CPU'})",
        "",
        f"{result['params'] / 1e6:.1f}M-parameter scratch Llama, {s['dtype']} on {machine_line(result['machine'])}; "
        f"{s['seqs']} sequences of {s['prompt_tokens']} prompt tokens + responses of {s['short'][0]}-{s['short'][1]} "
        f"tokens, one in {s['long_every']} of {s['long'][0]}-{s['long'][1]} (here {min(lens)}..{max(lens)}, "
        f"{real} real tokens per step); micro-batch budget {s['max_tokens']} tokens; GRPO steps through "
        f"StageTraining, {s['steps']} per run (the first not timed); {s['repeats']} repeats, sides alternating, "
        "each a fresh process. Trainer peak = the process's peak resident memory less its resident memory "
        "before the trainer was built" + ("; CUDA peak = the allocator's peak." if cuda else "."),
        "",
        "| side | computed tokens / step | micro-batches | train tokens/s (median) | "
        + ("MFU | " if cuda else "")
        + "trainer peak GiB | "
        + ("CUDA peak GiB | " if cuda else "")
        + "first loss |",
        "|---|---|---|---|---|" + ("---|---|" if cuda else "") + "---|",
    ]
    for side in SIDES:
        rs, plan = runs[side], result["planned"][side]
        tokens_per_s = statistics.median(r["tokens_per_s"] for r in rs)
        # of the real tokens' work (6 x parameters x tokens): padding computed is not counted
        util = mfu(tokens_per_s, 1.0, result["params"], result["machine"]["gpu"]) if cuda else None
        lines.append(
            f"| {side} | {plan['computed_tokens']} | {plan['micro_batches']} | {tokens_per_s:.0f} | "
            + (f"{util:.1%} | " if util is not None else "- | " if cuda else "")
            + f"{statistics.median(r['trainer_peak_gib'] for r in rs):.2f} | "
            + (f"{statistics.median(r['cuda_peak_gib'] for r in rs):.2f} | " if cuda else "")
            + f"{rs[0]['losses'][0]:.6f} |"
        )
    lines += ["", "Ratio to `padded` per repeat (min / median / max):", ""]
    for side, keys in result["over_padded"].items():
        for key, sp in keys.items():
            lines.append(f"- {side} {key}: {sp['min']:.3f} / {sp['median']:.3f} / {sp['max']:.3f}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, key, label in (
        (axes[0], "tokens_per_s", "train tokens/s"),
        (axes[1], "trainer_peak_gib", "trainer peak GiB"),
    ):
        values = [statistics.median(r[key] for r in result["runs"][side]) for side in SIDES]
        ax.bar(SIDES, values, color=["tab:gray", "tab:orange", "tab:blue"])
        ax.set_title(label)
    save_figure(fig, path)


def _span(text: str) -> tuple[int, int]:
    """argparse type: LO,HI with 0 < LO <= HI."""
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        lo = hi = 0
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"want LO,HI with 0 < LO <= HI; got {text!r}")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=positive_int, default=2, help="measured repeats of each side")
    parser.add_argument(
        "--steps", type=positive_int, default=3, help="steps per run (the first is not timed)"
    )
    parser.add_argument("--hidden", type=positive_int, default=512, help="the model's hidden size")
    parser.add_argument("--layers", type=positive_int, default=6, help="the model's layers")
    parser.add_argument("--heads", type=positive_int, default=8, help="the model's attention heads")
    parser.add_argument(
        "--model",
        default=None,
        choices=tuple(MODELS),
        help="a named scratch shape (overrides --hidden, --layers, --heads)",
    )
    parser.add_argument("--seqs", type=positive_int, default=48, help="sequences per step")
    parser.add_argument("--prompt-tokens", type=positive_int, default=16, help="prompt tokens per sequence")
    parser.add_argument("--short", type=_span, default=(32, 128), help="LO,HI: most responses' lengths")
    parser.add_argument("--long", type=_span, default=(1024, 2048), help="LO,HI: the tail's lengths")
    parser.add_argument(
        "--long-every", type=positive_int, default=12, help="one response in this many is long"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, default=16384, help="trainer.max_token_len_per_gpu"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads per side")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one side may take")
    parser.add_argument("--out", default=default_out("packing.json"), help="where the JSON result goes")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a side's own process
    add_device_args(parser)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--side-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    args.dtype = resolved_dtype(args)
    if args.model is None and args.hidden % args.heads:
        parser.error("--hidden must be divisible by --heads")
    if args.side is not None:
        with open(args.side_out, "w") as f:
            json.dump(run_side(args), f)
        return 0
    args.passthrough = [
        f"--{k.replace('_', '-')}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
        for k, v in vars(args).items()
        if k
        in (
            "steps",
            "seqs",
            "prompt_tokens",
            "short",
            "long",
            "long_every",
            "max_tokens",
            "threads",
            "device",
            "dtype",
        )
    ]
    with tempfile.TemporaryDirectory(prefix="rlcore-packing-") as workdir:
        result = measure(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
