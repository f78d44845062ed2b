"""How long a launch takes to start: a 1-step GRPO launch (the scratch model and arithmetic taskset
of every benchmark, one rollout worker beside one trainer rank, as the quickstart runs) with its
processes forked from the fork server (`cluster.fork_server=on`, runtime/fork_server.py) and with
each process importing for itself (`off`), the two sides alternating.

Per launch: the seconds from the command's start to its first step's metrics row (what a user
waits for before a run does anything) and to the command's end. Per repeat the ratio off / on of
each; min / median / max over the repeats (these machines drift by about 30% over minutes: ratios
measured side by side, never one absolute time).

    rlcore bench startup                   # 5 repeats
    rlcore bench startup --repeats 2 --out runs/bench/startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import positive_int
from rlcore.benchmarks.common import (
    MAX_PROMPT_TOKENS,
    default_out,
    machine_info,
    machine_line,
    prepare,
    run_sides,
    spread,
    write_outputs,
)

SIDES = ("on", "off")
MAX_TOKENS = 8


def _config(model_dir: str, tasks: str, root: str, side: str) -> str:
    cfg = {
        "project": "bench", "name": "startup", "checkpoint_root_dir": root, "seed": 0,
        "model": {"model_path": model_dir, "max_model_len": 128, "max_prompt_tokens": MAX_PROMPT_TOKENS,
                  "max_response_tokens": MAX_TOKENS},
        "cluster": {"device": "cpu", "fork_server": side},
        "algorithm": {"repeat_times": 4},
        "buffer": {"batch_size": 4, "total_steps": 1, "explorer_input": {"taskset": {
            "path": tasks, "rollout_args": {"max_tokens": MAX_TOKENS}, "reward_fn": ["exact_match"]}}},
        "trainer": {"save_hf_checkpoint": "never"},
        "monitor": {"monitor_type": ["jsonl"]},
    }  # fmt: skip
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "config.yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


def one_launch(model_dir: str, tasks: str, workdir: str, side: str, rep: int, timeout_s: float) -> dict[str, float]:
    """One launch: seconds to its first metrics row and to its end."""
    root = os.path.join(workdir, f"{side}-{rep}")
    config = _config(model_dir, tasks, root, side)
    metrics = os.path.join(root, "bench", "startup", "metrics.jsonl")
    log_path = os.path.join(workdir, f"{side}-{rep}.log")
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "rlcore.cli", "launch", config], stdout=log, stderr=log)
        first = None
        while proc.poll() is None:
            if first is None and os.path.exists(metrics) and os.path.getsize(metrics):
                first = time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                raise RuntimeError(f"the {side} launch took over {timeout_s} s; see {log_path}")
            time.sleep(0.02)
        total = time.perf_counter() - t0
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"the {side} launch exited with {proc.returncode}; see {log_path}")
    return {"first_step_s": first, "total_s": total}


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("first_step_s", "total_s"):
        out[key] = {side: spread([r[key] for r in runs[side]]) for side in SIDES}
        out[f"{key}_ratio_off_over_on"] = spread([off[key] / on[key] for on, off in zip(runs["on"], runs["off"], strict=True)])
    return out


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# Launch start-up: processes forked from the fork server (on) or fresh (off)",
        "",
        f"Machine: {machine_line(result['machine'])}; {result['repeats']} repeats, sides alternating; "
        "a 1-step GRPO launch (one rollout worker, one trainer rank, scratch model).",
        "",
        "| | on (s) | off (s) | off / on |",
        "|---|---|---|---|",
    ]
    for key, name in (("first_step_s", "to the first step"), ("total_s", "whole launch")):
        on, off, ratio = s[key]["on"], s[key]["off"], s[f"{key}_ratio_off_over_on"]
        lines.append(
            f"| {name} | {on['median']:.1f} ({on['min']:.1f}-{on['max']:.1f}) | {off['median']:.1f} "
            f"({off['min']:.1f}-{off['max']:.1f}) | {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}) |"
        )
    return "\n".join(lines)


def plot(path: str, result: dict[str, Any]) -> None:
    from rlcore.benchmarks.common import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = ("first_step_s", "total_s")
    for i, side in enumerate(SIDES):
        values = [result["summary"][k][side]["median"] for k in keys]
        ax.bar([j + 0.4 * i for j in range(len(keys))], values, width=0.4, label=f"fork server {side}")
    ax.set_xticks([j + 0.2 for j in range(len(keys))], ["to the first step", "whole launch"])
    ax.set_ylabel("seconds (median)")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlcore bench startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=5, help="pairs of launches (default: 5)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one launch may take (default: 600)")
    parser.add_argument("--out", default=default_out("startup.json"),
                        help="the JSON result; .md and .png beside it (default: %(default)s)")
    args = parser.parse_args(argv)
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="rlcore-bench-startup-") as workdir:
        model_dir, tasks = prepare(workdir, num_tasks=64)
        runs = run_sides(
            SIDES, args.repeats, lambda side, rep: one_launch(model_dir, tasks, workdir, side, rep, args.timeout),
            lambda r: f"first step {r['first_step_s']:.1f} s, launch {r['total_s']:.1f} s", label="fork server ",
            width=3,
        )  # fmt: skip
    result = {"machine": machine, "repeats": args.repeats, "runs": runs, "summary": summarize(runs)}
    write_outputs(result, args.out, markdown(result), lambda p: plot(p, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
