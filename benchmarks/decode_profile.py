"""Where the HF engine's decode time goes: tokens/s of its loop, then one call under torch's profiler.

In this process: the scratch model (`--model`), the HF engine on `--device` (CUDA graphs over a
static cache on a GPU, the eager loop with `--eager` or on CPU), one warm-up call (captures the
graphs), `--calls` timed calls of `--prompts` prompts x `--n` samples of `--max-tokens` tokens at
temperature 1 (seeded), then one more call profiled. Reported: tokens/s; the wall time per decode
step (a call's time over its longest completion); on CUDA the device's busy time per step (the sum
of its kernels' time) and the share of the step the device was busy (the rest it waited on the
host); the operators that take the most device time and the most host time; and the floor a
decode step cannot beat on this GPU: reading the weights once at the memory bandwidth.

    rlcore bench decode --device cuda --model 0.5b --prompts 8 --n 8 --max-tokens 96
    rlcore bench decode --model tiny --prompts 2 --n 2 --max-tokens 8 --calls 1      # CPU smoke

Writes --out (JSON), its markdown, and the profiler's Chrome trace beside it (<out>.trace.json.gz,
open in https://ui.perfetto.dev).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import add_model_args, check_device, positive_int, resolved_dtype
from rlcore.benchmarks.common import (
    count_params,
    count_tokens,
    default_out,
    machine_info,
    machine_line,
    model_len,
    prepare,
    pyplot,
    save_figure,
    versions,
    write_outputs,
)
from rlcore.benchmarks.throughput import SEED, task_prompts

MEMORY_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}
"""Bytes/s of the GPU's memory (HBM) by name fragment: a decode step reads every weight once."""
TOP = 15
"""Operators listed per table."""


def _device_us(event: Any) -> float:
    """An averaged event's own device time in microseconds (torch renamed cuda_* to device_*)."""
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))


def profile(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity
    from transformers import AutoTokenizer

    from rlcore.core.types import SamplingParams
    from rlcore.rollout.engines.hf import HFEngine

    model_dir, tasks = prepare(workdir, args.prompts, model_len(args.max_tokens), args.model)
    params = count_params(model_dir)
    engine = HFEngine(
        model_dir, device=args.device, dtype=resolved_dtype(args), max_model_len=model_len(args.max_tokens),
        max_batch_size=args.prompts * args.n, enforce_eager=args.eager,
    )  # fmt: skip
    graphs = engine._static is not None
    prompts = task_prompts(tasks, AutoTokenizer.from_pretrained(model_dir), args.prompts)
    sampling = SamplingParams(temperature=1.0, n=args.n, max_tokens=args.max_tokens, seed=SEED)
    cuda = args.device == "cuda"

    def call() -> tuple[float, int, int]:
        t0 = time.perf_counter()
        out = engine.generate(prompts, sampling)
        if cuda:
            torch.cuda.synchronize()
        steps = max(len(c.token_ids) for row in out for c in row)
        return time.perf_counter() - t0, count_tokens(out), steps

    call()  # warm-up: captures the CUDA graphs
    timed = [call() for _ in range(args.calls)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        seconds, tokens, steps = call()
    trace = os.path.join(workdir, "trace.json")
    prof.export_chrome_trace(trace)
    averages = prof.key_averages()
    device_us = sum(_device_us(e) for e in averages)

    def top(key: Any) -> list[dict[str, Any]]:
        rows = sorted(averages, key=key, reverse=True)[:TOP]
        return [{"name": e.key, "calls": e.count, "device_ms": _device_us(e) / 1e3,
                 "host_ms": e.self_cpu_time_total / 1e3} for e in rows]  # fmt: skip

    gpu = machine_info()["gpu"]
    bandwidth = next((b for name, b in MEMORY_BANDWIDTH.items() if gpu and name in gpu), None)
    weight_bytes = params * (2 if resolved_dtype(args) == "bfloat16" else 4)
    total_s, total_tokens = sum(t[0] for t in timed), sum(t[1] for t in timed)
    return {
        "params": params,
        "graphs": graphs,
        "tokens_per_s": total_tokens / total_s,
        "step_ms": [1e3 * s / max(n, 1) for s, _, n in timed],
        "profiled": {
            "seconds": seconds,
            "tokens": tokens,
            "steps": steps,
            "step_ms": 1e3 * seconds / max(steps, 1),
            "device_busy_ms_per_step": device_us / 1e3 / max(steps, 1) if cuda else None,
            "device_busy_share": device_us / 1e6 / seconds if cuda else None,
        },  # fmt: skip
        "floor_ms_per_step": 1e3 * weight_bytes / bandwidth if bandwidth else None,
        "top_device": top(_device_us) if cuda else [],
        "top_host": top(lambda e: e.self_cpu_time_total),
        "trace": trace,
    }


def markdown(result: dict[str, Any]) -> str:
    cfg, p = result["settings"], result["profiled"]
    lines = [
        f"HF engine decode ({'CUDA graphs over a static cache' if result['graphs'] else 'eager loop'}), "
        f"`--model {cfg['model']}` ({result['params'] / 1e6:.0f}M parameters), {cfg['prompts']} prompts x "
        f"{cfg['n']} samples x up to {cfg['max_tokens']} tokens, {result['dtype']} on {machine_line(result['machine'])}.",
        "",
        f"- tokens/s over {cfg['calls']} timed calls: **{result['tokens_per_s']:.0f}**; wall time per decode step "
        f"(a call over its longest completion): {', '.join(f'{s:.2f}' for s in result['step_ms'])} ms",
        f"- the profiled call: {p['seconds']:.3f} s, {p['steps']} steps, {p['step_ms']:.2f} ms per step",
    ]
    if p["device_busy_ms_per_step"] is not None:
        lines.append(
            f"- device busy {p['device_busy_ms_per_step']:.2f} ms per step ({p['device_busy_share']:.0%} of the "
            "wall time; the rest the GPU waited on the host)"
        )
    if result["floor_ms_per_step"]:
        lines.append(
            f"- floor: reading the weights once per step at the memory bandwidth takes "
            f"{result['floor_ms_per_step']:.3f} ms (the wall step is {p['step_ms'] / result['floor_ms_per_step']:.0f}x that)"
        )
    for title, rows in (("device time", result["top_device"]), ("host time", result["top_host"])):
        if not rows:
            continue
        lines += ["", f"Top {len(rows)} operators by {title} (the profiled call):", "",
                  "| operator | calls | device ms | host ms |", "|---|---:|---:|---:|"]  # fmt: skip
        lines += [
            f"| `{r['name'][:70]}` | {r['calls']} | {r['device_ms']:.2f} | {r['host_ms']:.2f} |" for r in rows
        ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """The top operators' time (device time on a GPU, host time elsewhere) in the profiled call."""
    plt = pyplot()
    device = bool(result["top_device"])
    rows = result["top_device"] if device else result["top_host"]
    fig, ax = plt.subplots(figsize=(9, 5))
    names = [r["name"][:48] for r in rows][::-1]
    ax.barh(names, [r["device_ms" if device else "host_ms"] for r in rows][::-1])
    ax.set_xlabel(f"{'device' if device else 'host'} ms in the profiled call")
    ax.set_title(f"HF engine decode: {result['profiled']['step_ms']:.2f} ms per step")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_model_args(parser)
    parser.add_argument("--prompts", type=positive_int, default=8, help="prompts per call")
    parser.add_argument("--n", type=positive_int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=96, help="generation budget per sample")
    parser.add_argument("--calls", type=positive_int, default=3, help="timed calls before the profiled one")
    parser.add_argument("--eager", action="store_true", help="the eager loop (no CUDA graphs)")
    parser.add_argument(
        "--out", default=default_out("decode_profile.json"), help="where the JSON result goes"
    )
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    with tempfile.TemporaryDirectory(prefix="rlcore-decode-") as workdir:
        result = profile(args, workdir)
        out_trace = os.path.splitext(args.out)[0] + ".trace.json.gz"
        os.makedirs(os.path.dirname(os.path.abspath(out_trace)), exist_ok=True)
        with open(result.pop("trace"), "rb") as src, gzip.open(out_trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
    result.update(benchmark="decode_profile", settings=vars(args), dtype=resolved_dtype(args),
                  machine=machine_info(), versions=versions(), trace=os.path.basename(out_trace))  # fmt: skip
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    p = result["profiled"]
    print(f"decode: {result['tokens_per_s']:.0f} tokens/s, {p['step_ms']:.2f} ms per step"
          + (f", device busy {p['device_busy_share']:.0%}" if p["device_busy_share"] is not None else "")
          + f"; {args.out}, trace {out_trace}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
