"""Ulysses sequence parallelism: the longest sequence a trainer rank's memory budget trains, with the
sequence split over 2 ranks against held whole by each.

Both sides are a trainer world of 2 ranks (torchrun; gloo on CPU, NCCL on CUDA) on the same scratch
Llama with FSDP2 sharding parameters, gradients and AdamW state over both ranks alike:

    whole    trainer.ulysses_sequence_parallel_size 1: two sequences of L tokens, one per rank
    split    ulysses_sequence_parallel_size 2: the same two sequences, one micro-batch each, every
             micro-batch's L tokens sliced over both ranks (L / 2 each)

so the sides differ only in the tokens a rank's forward and backward hold at once. Each (side, L) is
a fresh world that takes one GRPO step on short sequences (AdamW's state is built), then measures
one step on the two sequences of L: its peak memory above what the rank held before (CPU: resident
memory sampled every 2 ms; CUDA: the allocator's peak), the larger of the two ranks'. L doubles from
--start while both sides stay under --budget-gib; reported: each side's peak per L, the longest L
under the budget on each side, split's peak over whole's at each L, and the step times.

    rlcore bench ulysses                                   # 2-core CPU: 1k.. tokens, 1 GiB budget
    rlcore bench ulysses --start 256 --max 1024 --hidden 64 --layers 2 --budget-gib 4
    rlcore bench ulysses --device cuda --model 0.5b --start 8192 --budget-gib 40   # 2 GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

from rlcore.benchmarks.cli_args import add_device_args, check_device, positive_int, resolved_dtype
from rlcore.benchmarks.common import (
    MODELS,
    build_scratch,
    default_out,
    machine_info,
    machine_line,
    pyplot,
    rss_gib,
    run_helper,
    save_figure,
    versions,
    write_outputs,
)

SIDES = {"whole": 1, "split": 2}
"""side -> trainer.ulysses_sequence_parallel_size."""
RANKS = 2


class PeakRSS:
    """The highest resident memory of this process while inside (sampled every 2 ms), above what it
    held on entry: `grown`."""

    def __init__(self) -> None:
        self.start = self.peak = rss_gib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_gib())

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_gib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_gib())

    @property
    def grown(self) -> float:
        return self.peak - self.start


def run_rank(args: argparse.Namespace) -> None:
    """One rank of one side's world: a warm-up step, then the measured step on two sequences of L."""
    import torch
    import torch.distributed as dist

    from rlcore.core.config.schema import RLCoreConfig
    from rlcore.runtime.trainer_world import world_backend
    from rlcore.runtime.training import StageTraining, sequence_spec

    cuda = args.device == "cuda"
    torch.set_num_threads(args.threads)
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(world_backend(args.device))
    cfg = RLCoreConfig(seed=0)
    cfg.model.model_path, cfg.model.dtype = args.model_dir, args.dtype
    cfg.trainer.strategy = "fsdp2"
    cfg.trainer.ulysses_sequence_parallel_size = SIDES[args.side]
    cfg.trainer.max_token_len_per_gpu = args.length // SIDES[args.side]  # one sequence per micro-batch
    gen = torch.Generator().manual_seed(0)

    def specs(n: int) -> list:
        response = n - PROMPT_TOKENS
        return [
            sequence_spec([5] * PROMPT_TOKENS, torch.randint(4, 80, (response,), generator=gen).tolist(), [], [a],
                          [-4.0] * response)
            for a in (1.0, -1.0)
        ]  # fmt: skip

    with tempfile.TemporaryDirectory() as stage_dir:
        training = StageTraining(cfg, stage_dir, args.model_dir, args.device, 2)
        training.train_sequences(specs(4 * PROMPT_TOKENS), "grpo", 1.0, 0.0)  # AdamW's state, warm allocators
        training.optimizer_step()
        batch = specs(args.length)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated() / 2**30 if cuda else 0.0
        t0 = time.perf_counter()
        with PeakRSS() as rss:
            out = training.train_sequences(batch, "grpo", 1.0, 0.0)
            training.optimizer_step()
            if cuda:
                torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 - held if cuda else rss.grown
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {"peak_gib": peak, "step_s": step_s, "loss": float(out["loss"])})
    if dist.get_rank() == 0:
        with open(args.side_out, "w") as f:
            json.dump(parts, f)
    dist.destroy_process_group()


PROMPT_TOKENS = 8


# ---------------------------------------------------------------------------- the benchmark


def one(args: argparse.Namespace, workdir: str, side: str, length: int) -> dict[str, Any]:
    """One side's world at one length: each rank's peak and step time, and the larger peak."""
    out = os.path.join(workdir, f"{side}-{length}.json")
    cmd = [
        sys.executable, "-m", "rlcore.runtime.torchrun", "--standalone", f"--nproc-per-node={RANKS}",
        "-m", "rlcore.benchmarks.ulysses", "--side", side, "--length", str(length),
        "--model-dir", os.path.join(workdir, "model"), "--side-out", out, *args.passthrough,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    ranks = run_helper(cmd, out, args.run_timeout, f"{side} at {length} tokens", env)
    return {"length": length, "ranks": ranks, "peak_gib": max(r["peak_gib"] for r in ranks),
            "step_s": max(r["step_s"] for r in ranks), "loss": ranks[0]["loss"]}  # fmt: skip


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    params = build_scratch(os.path.join(workdir, "model"), args, args.max)
    print(f"ulysses: {params / 1e6:.1f}M parameters, {RANKS} ranks, 2 sequences from {args.start} tokens, "
          f"per-rank budget {args.budget_gib} GiB", flush=True)  # fmt: skip
    points: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    length, flip = args.start, False
    while length <= args.max:
        for side in list(SIDES)[::-1] if flip else list(SIDES):  # alternate which side goes first
            if points[side] and points[side][-1]["peak_gib"] > args.budget_gib:
                continue  # over the budget at a shorter length already
            t0 = time.perf_counter()
            points[side].append(one(args, workdir, side, length))
            p = points[side][-1]
            print(f"  {side:>5} {length:>6} tokens: peak {p['peak_gib']:.3f} GiB per rank, step {p['step_s']:.2f} s "
                  f"(run {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
        if all(points[s][-1]["peak_gib"] > args.budget_gib for s in SIDES):
            break
        length, flip = length * 2, not flip
    longest = {
        side: max((p["length"] for p in pts if p["peak_gib"] <= args.budget_gib), default=None)
        for side, pts in points.items()
    }
    whole = {p["length"]: p for p in points["whole"]}
    ratios = [
        {"length": p["length"], "split_over_whole_peak": p["peak_gib"] / whole[p["length"]]["peak_gib"],
         "split_over_whole_step": p["step_s"] / whole[p["length"]]["step_s"],
         "loss_diff": abs(p["loss"] - whole[p["length"]]["loss"])}
        for p in points["split"] if p["length"] in whole
    ]  # fmt: skip
    return {
        "benchmark": "ulysses",
        "machine": machine_info(),
        "versions": versions(),
        "params": params,
        "settings": {k: v for k, v in vars(args).items() if k != "passthrough"},
        "points": points,
        "longest_under_budget": longest,
        "at_equal_length": ratios,
    }


def markdown(result: dict[str, Any]) -> str:
    s, longest = result["settings"], result["longest_under_budget"]
    cuda = s["device"] == "cuda"
    lines = [
        f"# Ulysses: the longest sequence a rank's budget trains ({'CUDA' if cuda else 'CPU'})",
        "",
        f"{result['params'] / 1e6:.1f}M-parameter scratch Llama, {s['dtype']} on {machine_line(result['machine'])}; "
        f"{RANKS} ranks of FSDP2 on both sides; a GRPO step on 2 sequences of L tokens: `whole` one per rank, "
        f"`split` each sliced over both ranks (trainer.ulysses_sequence_parallel_size 2). Peak = "
        + ("the allocator's peak above what the rank held before the step" if cuda else
           "the rank's resident memory sampled every 2 ms, above what it held before the step")
        + f", the larger rank's; per-rank budget {s['budget_gib']} GiB.",
        "",
        f"Longest L under the budget: whole {longest['whole']}, split {longest['split']}.",
        "",
        "| L | whole peak GiB | split peak GiB | split / whole peak | whole step s | split step s | loss diff |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    by_side = {side: {p["length"]: p for p in pts} for side, pts in result["points"].items()}
    ratio = {r["length"]: r for r in result["at_equal_length"]}

    def cell(side: str, length: int, key: str, fmt: str) -> str:
        point = by_side[side].get(length)
        return format(point[key], fmt) if point else "-"

    for length in sorted(set(by_side["whole"]) | set(by_side["split"])):
        r = ratio.get(length)
        lines.append(
            f"| {length} | {cell('whole', length, 'peak_gib', '.3f')} | {cell('split', length, 'peak_gib', '.3f')} | "
            f"{format(r['split_over_whole_peak'], '.3f') if r else '-'} | {cell('whole', length, 'step_s', '.2f')} | "
            f"{cell('split', length, 'step_s', '.2f')} | {format(r['loss_diff'], '.2e') if r else '-'} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for side, pts in result["points"].items():
        ax.plot([p["length"] for p in pts], [p["peak_gib"] for p in pts], marker="o", label=side)
    ax.axhline(result["settings"]["budget_gib"], color="gray", linestyle="--", label="budget")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("peak GiB per rank")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--start", type=positive_int, default=1024, help="the first L (doubled each point)")
    parser.add_argument("--max", type=positive_int, default=65536, help="the longest L tried")
    parser.add_argument("--budget-gib", type=float, default=1.0, help="a rank's memory budget for the step")
    parser.add_argument("--hidden", type=positive_int, default=256, help="the model's hidden size")
    parser.add_argument("--layers", type=positive_int, default=4, help="the model's layers")
    parser.add_argument("--heads", type=positive_int, default=4, help="the model's attention heads")
    parser.add_argument(
        "--model",
        default=None,
        choices=tuple(MODELS),
        help="a named scratch shape (overrides --hidden, --layers, --heads)",
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads per rank")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one world may take")
    parser.add_argument("--out", default=default_out("ulysses.json"), help="where the JSON result goes")
    add_device_args(parser)
    parser.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)  # a rank of one world
    parser.add_argument("--length", type=positive_int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--side-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    args.dtype = resolved_dtype(args)
    if args.side is not None:
        run_rank(args)
        return 0
    if args.start <= 4 * PROMPT_TOKENS or args.start > args.max:
        parser.error(f"--start must be over {4 * PROMPT_TOKENS} and at most --max")
    if (args.model is None and args.heads % 2) or args.budget_gib <= 0:
        parser.error("--heads must be even (split over 2 ranks) and --budget-gib positive")
    args.passthrough = [f"--threads={args.threads}", f"--device={args.device}", f"--dtype={args.dtype}"]
    with tempfile.TemporaryDirectory(prefix="rlcore-ulysses-") as workdir:
        result = measure(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
