"""Long tails: what over-rollout and the dynamic timeout buy when some tasks are slow.

Each repeat runs the same GRPO work (asynchronous `both`, as `rlcore bench async` runs it: a rollout
worker on --rollout-cpus, the launch on --trainer-cpus) once per side, in alternating order, on a
taskset with a slow tail; reported per side: trained tokens per second and its ratio to wait-all per
repeat (min / median / max), the explorer's median step, the tasks left out, the reward curve.

`SlowTailWorkflow` is the slow tail: the single-turn workflow, plus a wait of `slow_s` seconds on a
fixed `slow_fraction` of the tasks (chosen by task id), as a slow reward service or a stuck sandbox
would add. It runs on the rollout workers (`default_workflow_type:
rlcore.benchmarks.long_tails:SlowTailWorkflow`).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import check_separate_cpus, positive_int
from rlcore.benchmarks.common import (
    default_out,
    machine_info,
    model_len,
    prepare,
    run_sides,
    spread,
    versions,
    write_outputs,
)
from rlcore.core.types import Experience, SamplingParams, Task
from rlcore.rollout.workflows.single_turn import SingleTurnWorkflow


def is_slow(task_id: str, fraction: float) -> bool:
    """Whether a task is in the slow tail: a fixed `fraction` of task ids."""
    digest = hashlib.blake2b(task_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


class SlowTailWorkflow(SingleTurnWorkflow):
    """Single turn, then `slow_s` seconds more for each task in the slow tail."""

    KEYS = ("slow_fraction", "slow_s")

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        fraction, seconds = args.get("slow_fraction", 0.0), args.get("slow_s", 0.0)
        if not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
            raise ValueError(f"workflow_args.slow_fraction must be a number in [0, 1]; got {fraction!r}")
        if not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"workflow_args.slow_s must be a number of seconds >= 0; got {seconds!r}")

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        experiences = super().run(tasks, sampling, policy_version)
        fraction = float(self.args.get("slow_fraction", 0.0))
        slow = sum(is_slow(t.task_id, fraction) for t in tasks)
        time.sleep(slow * float(self.args.get("slow_s", 0.0)))
        return experiences


# ---------------------------------------------------------------------------- the benchmark

SIDES = ("wait-all", "per-task", "over-rollout", "dynamic-timeout")
"""wait-all: the explorer's default, a step's batch at once (a worker runs a batch's rewards one
after the other); per-task: the task scheduler without a cut (dynamic timeout at a ratio no task
reaches), tasks run side by side; over-rollout: it, and a step leaves up to --ratio of its tasks
running; dynamic-timeout: it, and a task slower than 3x the running mean is cut and left out."""


def side_config(side: str, ratio: float) -> dict[str, Any]:
    """The `explorer` keys of a side."""
    if side == "per-task":
        return {"dynamic_timeout": {"enable": True, "ratio": 1.0e6}}
    if side == "over-rollout":
        return {"over_rollout": {"ratio": ratio, "wait_after_min": 0.0}}
    if side == "dynamic-timeout":
        return {"dynamic_timeout": {"enable": True, "ratio": 3.0}, "max_retry_times": 0}
    return {}


def explorer_rows(root: str) -> list[dict[str, float]]:
    (path,) = glob.glob(os.path.join(root, "**", "explorer", "metrics.jsonl"), recursive=True)
    with open(path) as f:
        return [r for r in map(json.loads, f) if "buffer/groups_put" in r]


def run_side(side: str, assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace) -> dict:
    from rlcore.benchmarks.async_explore import launch_against_worker, summary

    def configure(cfg: dict) -> None:
        cfg["synchronizer"] = {"asynchronous": True, "max_staleness": args.staleness}
        ts = cfg["buffer"]["explorer_input"]["taskset"]
        ts["default_workflow_type"] = f"{__name__}:SlowTailWorkflow"
        ts["workflow_args"] = {"slow_fraction": args.slow_fraction, "slow_s": args.slow_s}
        cfg["stages"][0]["explorer"].update(side_config(side, args.ratio))

    # tasks left out (dynamic-timeout) leave the trainer fewer groups: it trains fewer steps
    root, rows = launch_against_worker(
        assets, workdir, tag, args, configure, every_step=side != "dynamic-timeout"
    )
    explored = explorer_rows(root)
    out = summary(rows)
    out.update(
        explore_step_s=statistics.median(r["perf/step_time_s"] for r in explored),
        tasks_dropped=sum(r.get("rollout/tasks_dropped", 0.0) for r in explored),
        tasks_left_running=statistics.fmean(r.get("rollout/tasks_left_running", 0.0) for r in explored),
        groups_put=sum(r["buffer/groups_put"] for r in explored),
    )
    return out


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    from rlcore.benchmarks.async_explore import WARM_STEPS

    assets = prepare(
        workdir,
        num_tasks=args.prompts * (WARM_STEPS + args.steps + 1) * 4,
        max_model_len=model_len(args.max_tokens),
    )  # the model's positions fit --max-tokens
    runs = run_sides(
        SIDES, args.repeats, lambda side, rep: run_side(side, assets, workdir, f"{side}-{rep}", args),
        lambda r: f"{r['tokens_per_s']:.0f} trained tokens/s, explore step {r['explore_step_s']:.2f} s, "
        f"{r['tasks_dropped']:.0f} tasks left out", width=15,
    )  # fmt: skip
    base = runs["wait-all"]
    return {
        "benchmark": "tails",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "versions": versions(),
        "runs": runs,
        "tokens_per_s": {side: spread([r["tokens_per_s"] for r in runs[side]]) for side in SIDES},
        "ratio_over_wait_all": {
            side: spread(
                [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs[side], base, strict=True)]
            )
            for side in SIDES[1:]
        },
        "reward_curve": {
            side: [statistics.median(step) for step in zip(*(r["reward"] for r in runs[side]), strict=False)]
            for side in SIDES
        },
    }


def markdown(result: dict[str, Any]) -> str:
    from rlcore.benchmarks.async_explore import WARM_STEPS

    cfg = result["config"]
    lines = [
        f"GRPO, asynchronous both (max_staleness {cfg['staleness']}): 1 trainer rank on CPUs {cfg['trainer_cpus']}, "
        f"1 rollout worker (HF engine) on CPUs {cfg['rollout_cpus']}; {cfg['prompts']} prompts x {cfg['group']} x "
        f"{cfg['max_tokens']} tokens; {cfg['slow_fraction']:.1%} of the tasks wait {cfg['slow_s']:g} s after "
        f"generating (SlowTailWorkflow); steps {WARM_STEPS + 1}-{WARM_STEPS + cfg['steps']} of each run measured, "
        f"{cfg['repeats']} alternating repeats. {result['machine']['cpu']}.",
        "",
        "| side | trained tokens/s (median) | / wait-all: min / median / max | explore step (s, median) | "
        "tasks left out (per run) | last reward |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for side, tps in result["tokens_per_s"].items():
        runs = result["runs"][side]
        ratio = result["ratio_over_wait_all"].get(side)
        cell = f"{ratio['min']:.2f} / **{ratio['median']:.2f}** / {ratio['max']:.2f}" if ratio else "1"
        lines.append(
            f"| {side} | {tps['median']:.0f} | {cell} | "
            f"{statistics.median(r['explore_step_s'] for r in runs):.2f} | "
            f"{statistics.median(r['tasks_dropped'] for r in runs):.0f} | {result['reward_curve'][side][-1]:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from rlcore.benchmarks.async_explore import add_launch_args

    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    add_launch_args(parser, steps=10, prompts=8, group=4, max_tokens=16, out=default_out("tails.json"))
    parser.add_argument("--staleness", type=positive_int, default=2, help="synchronizer.max_staleness")
    parser.add_argument("--slow-fraction", type=float, default=0.125, help="share of the tasks that are slow")
    parser.add_argument("--slow-s", type=float, default=2.0, help="seconds a slow task waits")
    parser.add_argument("--ratio", type=float, default=0.25, help="explorer.over_rollout.ratio of that side")
    args = parser.parse_args(argv)
    check_separate_cpus(parser, args.trainer_cpus, args.rollout_cpus)
    if not 0 <= args.slow_fraction <= 1 or args.slow_s < 0 or not 0 < args.ratio < 1:
        parser.error("--slow-fraction in [0, 1], --slow-s >= 0 and --ratio in (0, 1)")
    with tempfile.TemporaryDirectory(prefix="rlcore-tails-") as workdir:
        result = measure(args, workdir)
    from rlcore.benchmarks.async_explore import plot

    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
