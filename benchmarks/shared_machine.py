"""The quickstart on a machine it shares: `rlcore launch configs/quickstart.yaml` as a user runs it,
alone and beside N busy processes (each a Python loop that never sleeps, at the same priority),
alternating. A fair share of the cores predicts the slowdown: with the quickstart wanting all
cores and N busy processes beside it, about (N + cores) / cores; what is far above it is waste
(threads spinning while they wait, pools sized to cores the run does not get).

Per launch: its wall time, the median step time of each stage (perf/step_time_s), and the run's
numbers (every logged loss, reward and accuracy), which must be identical on both sides: sharing the
machine changes when things happen, never what is computed. Per repeat the ratio beside / alone;
min / median / max over the repeats (these machines drift by about 30% over minutes).

    rlcore bench shared                          # the whole quickstart, 2 repeats, 2 busy processes
    rlcore bench shared --repeats 1 --busy 1 --set stages.0.buffer.total_steps=20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import positive_int
from rlcore.benchmarks.common import (
    cell,
    default_out,
    machine_info,
    machine_line,
    run_sides,
    spread,
    write_outputs,
)
from rlcore.runtime.fork_client import ENV

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "quickstart.yaml"
)
NUMBERS = ("actor/loss", "rollout/reward_mean", "eval/test/accuracy")
"""The logged values that must not change with the machine's load."""
BUSY_LOOP = "while True: pass"


def busy_processes(n: int) -> list[subprocess.Popen]:
    """`n` processes that keep a core busy each until killed."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]


def stage_rows(root: str) -> dict[str, list[dict[str, Any]]]:
    """Each stage's metric rows, by stage folder name (stage0_sft_warmup, ...)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for dirpath, _, files in sorted(os.walk(root)):
        if "metrics.jsonl" in files and os.path.basename(dirpath).startswith("stage"):
            with open(os.path.join(dirpath, "metrics.jsonl")) as f:
                out[os.path.basename(dirpath)] = [json.loads(line) for line in f]
    if not out:
        raise RuntimeError(f"no stage wrote metrics.jsonl under {root}")
    return out


def one_launch(
    config: str, overrides: list[str], workdir: str, side: str, rep: int, busy: int, timeout_s: float
) -> dict:
    """One quickstart launch (`side` 'alone' or 'beside N busy'): wall seconds, each stage's median
    step time, and its numbers."""
    root = os.path.join(workdir, f"{side.replace(' ', '_')}-{rep}")
    log_path = root + ".log"
    env = {k: v for k, v in os.environ.items() if k != ENV}  # the launch as a user starts it: no warm server
    env["RLCORE_CHECKPOINT_DIR"] = root
    others = busy_processes(busy if side != "alone" else 0)
    try:
        with open(log_path, "w") as log:
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "rlcore.cli", "launch", config, *overrides],
                                  stdout=log, stderr=log, env=env, timeout=timeout_s)  # fmt: skip
            wall = time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {side} launch took over {timeout_s} s; see {log_path}") from None
    finally:
        for p in others:
            p.kill()
            p.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the {side} launch exited with {proc.returncode}; see {log_path}")
    stages = stage_rows(root)
    return {
        "wall_s": wall,
        "step_s": {
            name: statistics.median(r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r)
            for name, rows in stages.items()
        },
        "numbers": {
            name: [[r["step"], *(r.get(k) for k in NUMBERS)] for r in rows] for name, rows in stages.items()
        },
    }


def summarize(runs: dict[str, list[dict]], sides: tuple[str, str]) -> dict[str, Any]:
    alone, beside = runs[sides[0]], runs[sides[1]]
    stages = sorted(alone[0]["step_s"])
    reference = alone[0]["numbers"]
    return {
        "wall_s": {side: spread([r["wall_s"] for r in runs[side]]) for side in sides},
        "wall_ratio": spread([b["wall_s"] / a["wall_s"] for a, b in zip(alone, beside, strict=True)]),
        "step_s": {s: {side: spread([r["step_s"][s] for r in runs[side]]) for side in sides} for s in stages},
        "step_ratio": {
            s: spread([b["step_s"][s] / a["step_s"][s] for a, b in zip(alone, beside, strict=True)])
            for s in stages
        },
        "same_numbers": all(r["numbers"] == reference for side in sides for r in runs[side]),
        "final_accuracy": {s: reference[s][-1][3] for s in stages},
    }


def markdown(result: dict[str, Any]) -> str:
    s, (alone, beside) = result["summary"], result["sides"]

    lines = [
        f"# The quickstart alone and {beside}",
        "",
        f"Machine: {machine_line(result['machine'])}; {result['repeats']} repeats, sides alternating; "
        "`rlcore launch " + " ".join([os.path.relpath(result["config"]), *result["overrides"]]) + "`.",
        "",
        f"| | alone | {beside} | {beside} / alone |",
        "|---|---|---|---|",
        f"| whole run (s) | {cell(s['wall_s'][alone], '.0f')} | {cell(s['wall_s'][beside], '.0f')} | "
        f"**{cell(s['wall_ratio'], '.2f', 'x')}** |",
    ]
    for stage, ratio in s["step_ratio"].items():
        times = s["step_s"][stage]
        lines.append(f"| {stage} step (s) | {cell(times[alone], '.3f')} | {cell(times[beside], '.3f')} | "
                     f"{cell(ratio, '.2f', 'x')} |")  # fmt: skip
    fair = (result["busy"] + result["machine"]["cpus"]) / result["machine"]["cpus"]
    lines += [
        "",
        f"A fair share of the cores predicts about {fair:.1f}x. Every logged loss, reward and accuracy the "
        f"same on both sides and in every repeat: {'yes' if s['same_numbers'] else '**no**'}.",
    ]
    return "\n".join(lines)


def plot(path: str, result: dict[str, Any]) -> None:
    from rlcore.benchmarks.common import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    s, sides = result["summary"], result["sides"]
    keys = ["whole run", *s["step_ratio"]]
    ratios = [s["wall_ratio"]["median"], *(r["median"] for r in s["step_ratio"].values())]
    ax.bar(keys, ratios, color="tab:orange")
    ax.axhline((result["busy"] + result["machine"]["cpus"]) / result["machine"]["cpus"], color="gray",
               linestyle="--", label="fair share")  # fmt: skip
    ax.set_ylabel(f"{sides[1]} / alone (median)")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlcore bench shared", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=2, help="pairs of launches (default: 2)")
    parser.add_argument(
        "--busy", type=positive_int, default=2, help="busy processes beside the run (default: 2)"
    )
    parser.add_argument("--config", default=CONFIG, help="the run (default: configs/quickstart.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="a config override for every launch (repeatable; default: none, the quickstart as shipped)")  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one launch may take (default: 3600)"
    )
    parser.add_argument("--out", default=default_out("shared.json"),
                        help="the JSON result; .md and .png beside it (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    sides = ("alone", f"beside {args.busy} busy")
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="rlcore-bench-shared-") as workdir:
        runs = run_sides(
            sides, args.repeats,
            lambda side, rep: one_launch(args.config, args.overrides, workdir, side, rep, args.busy, args.timeout),
            lambda r: f"{r['wall_s']:.0f} s, step " + ", ".join(f"{v:.3f}" for v in r["step_s"].values()) + " s",
            width=len(sides[1]),
        )  # fmt: skip
    result = {
        "machine": machine, "repeats": args.repeats, "busy": args.busy, "sides": list(sides),
        "config": args.config, "overrides": args.overrides, "runs": runs, "summary": summarize(runs, sides),
    }  # fmt: skip
    write_outputs(result, args.out, markdown(result), lambda p: plot(p, result))
    return 0 if result["summary"]["same_numbers"] else 1


if __name__ == "__main__":
    sys.exit(main())
