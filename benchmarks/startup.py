"""How long a launch takes to start: a 1-step GRPO launch (the scratch model and arithmetic taskset
of every benchmark, one rollout worker beside one trainer rank, as the quickstart runs) three ways,
alternating: each process importing for itself (`off`), its processes forked from the launch's own
fork server (`on`: `cluster.fork_server=on`, runtime/fork_server.py), and the whole command handed
to a warm fork server that outlives launches (`warm`: `rlcore warm`, runtime/warm_server.py; started
once before the repeats, as a user keeps one open).

Per launch: the seconds from the command's start to its first step's metrics row (what a user
waits for before a run does anything) and to the command's end. Per repeat the ratios off / on and
off / warm of each; min / median / max over the repeats (these machines drift by about 30% over
minutes: ratios measured side by side, never one absolute time).

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
    cell,
    default_out,
    machine_info,
    machine_line,
    prepare,
    run_sides,
    spread,
    write_outputs,
)
from rlcore.runtime.fork_client import ENV
from rlcore.runtime.warm_server import WarmServer

SIDES = ("on", "off", "warm")
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


def one_launch(
    model_dir: str, tasks: str, workdir: str, side: str, rep: int, timeout_s: float, warm: str
) -> dict[str, float]:
    """One launch: seconds to its first metrics row and to its end (`warm`: the warm server's socket)."""
    root = os.path.join(workdir, f"{side}-{rep}")
    config = _config(model_dir, tasks, root, "on" if side == "warm" else side)
    metrics = os.path.join(root, "bench", "startup", "metrics.jsonl")
    log_path = os.path.join(workdir, f"{side}-{rep}.log")
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        env = {
            k: v for k, v in os.environ.items() if k != ENV
        }  # on and off: the launch's own server, or none
        if side == "warm":
            env[ENV] = warm
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore.cli", "launch", config], stdout=log, stderr=log, env=env
        )
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
        for side in SIDES[::2]:
            out[f"{key}_ratio_off_over_{side}"] = spread(
                [off[key] / r[key] for r, off in zip(runs[side], runs["off"], strict=True)]
            )
    return out


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# Launch start-up: fresh processes (off), forked from the launch's fork server (on), or from a warm one (warm)",
        "",
        f"Machine: {machine_line(result['machine'])}; {result['repeats']} repeats, sides alternating; "
        "a 1-step GRPO launch (one rollout worker, one trainer rank, scratch model).",
        "",
        "| | off (s) | on (s) | warm (s) | off / on | off / warm |",
        "|---|---|---|---|---|---|",
    ]

    for key, name in (("first_step_s", "to the first step"), ("total_s", "whole launch")):
        times = [cell(s[key][side], ".1f") for side in ("off", "on", "warm")]
        ratios = [cell(s[f"{key}_ratio_off_over_{side}"], ".2f", "x") for side in ("on", "warm")]
        lines.append(f"| {name} | {' | '.join(times + ratios)} |")
    return "\n".join(lines)


def plot(path: str, result: dict[str, Any]) -> None:
    from rlcore.benchmarks.common import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = ("first_step_s", "total_s")
    for i, side in enumerate(SIDES):
        values = [result["summary"][k][side]["median"] for k in keys]
        ax.bar([j + 0.27 * i for j in range(len(keys))], values, width=0.27, label=f"fork server {side}")
    ax.set_xticks([j + 0.27 for j in range(len(keys))], ["to the first step", "whole launch"])
    ax.set_ylabel("seconds (median)")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlcore bench startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=5, help="pairs of launches (default: 5)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one launch may take (default: 600)"
    )
    parser.add_argument(
        "--out",
        default=default_out("startup.json"),
        help="the JSON result; .md and .png beside it (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    machine = machine_info()
    with (
        tempfile.TemporaryDirectory(prefix="rlcore-bench-startup-") as workdir,
        WarmServer(export=False) as warm,
    ):
        model_dir, tasks = prepare(workdir, num_tasks=64)
        warm.wait_ready()
        runs = run_sides(
            SIDES, args.repeats,
            lambda side, rep: one_launch(model_dir, tasks, workdir, side, rep, args.timeout, warm.path),
            lambda r: f"first step {r['first_step_s']:.1f} s, launch {r['total_s']:.1f} s", label="fork server ",
            width=3,
        )  # fmt: skip
    result = {"machine": machine, "repeats": args.repeats, "runs": runs, "summary": summarize(runs)}
    write_outputs(result, args.out, markdown(result), lambda p: plot(p, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
