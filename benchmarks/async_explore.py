"""What asynchronous `both` (synchronizer.asynchronous) buys over lock-step when generation and
training have devices of their own: trained tokens per second, the staleness it trains at, and the
reward curve (does it still learn?).

Each repeat runs the same GRPO work once per side, in alternating order: lock-step (explore, train,
sync the weights over the group, repeat) and asynchronous at max_staleness 1, 2 and 4 (the explorer
thread keeps generating while the trainer trains; the workers load the weights it publishes). The
rollout worker is started by hand (`rlcore rollout serve`) on `--rollout-cpus`, and the launch, whose
trainer rank runs the loop, on `--trainer-cpus`: on a CPU machine these stand in for separate devices.

Reported per side: trained tokens per second (prompt + response tokens trained over the measured
steps' wall time: the steps after the first WARM_STEPS and before the last, which checkpoints), the
ratio to lock-step per repeat (min / median / max), the histogram of the steps' mean staleness and
the reward per step (median over repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
from collections import Counter
from typing import Any

from rlcore.benchmarks.cli_args import check_separate_cpus, cpu_list, int_list, positive_int
from rlcore.benchmarks.common import (
    GRPORun,
    default_out,
    machine_info,
    model_len,
    prepare,
    pyplot,
    rlcore_config,
    run_logged,
    run_sides,
    save_figure,
    spread,
    start_server,
    step_rows,
    versions,
    write_outputs,
)
from rlcore.core.config.schema import ControlConfig

WARM_STEPS = 2
"""Steps left out at a run's start (the first warms up; the asynchronous explorer's first rollout
has nothing to overlap with); the last step is left out too (it writes the checkpoint)."""
TOKEN_ENV = ControlConfig.token_env


def start_worker(
    root: str, model: str, max_model_len: int, cpus: set[int], env: dict[str, str], timeout_s: float,
    more: tuple[str, ...] = (),
):  # fmt: skip
    """`rlcore rollout serve` (HF engine, flags `more`) on `cpus`; the process and its address."""
    argv = ["rollout", "serve", "--model", model, "--engine", "hf", "--device", "cpu",
            "--max-model-len", str(max_model_len), "--threads", str(len(cpus)), *more]  # fmt: skip
    return start_server(argv, root, "worker", cpus, env, timeout_s)


def side_staleness(side: str) -> int | None:
    """async-2 -> 2; lockstep -> None."""
    return None if side == "lockstep" else int(side.split("-")[1])


def launch_against_worker(
    assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace, configure: Any,
    every_step: bool = True, worker_args: tuple[str, ...] = (), on_worker: Any = None,
) -> tuple[str, list[dict]]:  # fmt: skip
    """One asynchronous-or-lock-step launch (mode both, `configure(cfg)` edits its config) against a
    fresh rollout worker (started with `worker_args` more): the run folder and the trainer's step
    rows (all planned, or with `every_step` false as many as it trained). `on_worker(address,
    token)` is called once the launch is done, while the worker still serves."""
    root = os.path.join(workdir, tag)
    os.makedirs(root)
    env = {TOKEN_ENV: os.environ.get(TOKEN_ENV) or secrets.token_hex(16)}
    run = GRPORun(prompts=args.prompts, group=args.group, max_tokens=args.max_tokens, steps=args.steps)
    worker, address = start_worker(
        root, assets[0], run.max_model_len, set(args.rollout_cpus), env, args.run_timeout, worker_args
    )
    total = WARM_STEPS + args.steps + 1
    try:
        path = rlcore_config(*assets, root, run)
        with open(path) as f:
            cfg = json.load(f)
        stage = cfg["stages"][0]
        stage["mode"] = "both"
        stage["explorer"]["rollout_model"]["endpoints"] = [address]
        cfg["buffer"]["total_steps"] = total
        cfg["cluster"]["threads_per_rank"] = len(args.trainer_cpus)
        configure(cfg)
        with open(path, "w") as f:
            json.dump(cfg, f)
        log = os.path.join(root, "launch.log")
        cmd = [sys.executable, "-m", "rlcore.cli", "launch", path]
        run_logged(cmd, log, f"rlcore launch {tag}", args.run_timeout, env, set(args.trainer_cpus))
        if on_worker is not None:
            on_worker(address, env[TOKEN_ENV])
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return root, step_rows(os.path.join(root, "bench"), total if every_step else None, f"rlcore launch {tag}")


def summary(rows: list[dict]) -> dict[str, Any]:
    """A launch's measured steps: trained tokens/s, median step and phase times, the staleness and
    reward of every step."""
    measured = rows[WARM_STEPS:-1]
    seconds = sum(r["perf/step_time_s"] for r in measured)
    return {
        "tokens_per_s": sum(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in measured) / seconds,
        "step_s": statistics.median(r["perf/step_time_s"] for r in measured),
        "staleness": [r.get("rollout/staleness_mean", 0.0) for r in rows],
        "reward": [r.get("rollout/reward_mean", 0.0) for r in rows],
        "wait_s": statistics.median(r.get("perf/buffer_wait_s", 0.0) for r in measured),
        "generate_s": statistics.median(r.get("perf/generate_s", 0.0) for r in measured),
        "train_s": statistics.median(r.get("perf/train_s", 0.0) for r in measured),
        "sync_s": statistics.median(
            r.get("perf/sync_s", 0.0) + r.get("perf/publish_s", 0.0) for r in measured
        ),
    }


def run_side(side: str, assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace) -> dict:
    """One launch of `side` against a fresh rollout worker; its measured steps."""
    staleness = side_staleness(side)

    def configure(cfg: dict) -> None:
        if staleness is not None:
            cfg["synchronizer"] = {"asynchronous": True, "max_staleness": staleness}

    return summary(launch_against_worker(assets, workdir, tag, args, configure)[1])


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    sides = ["lockstep"] + [f"async-{s}" for s in args.staleness]
    assets = prepare(
        workdir,
        num_tasks=args.prompts * (WARM_STEPS + args.steps + 1) * 2,
        max_model_len=model_len(args.max_tokens),
    )  # the model's positions fit --max-tokens
    runs = run_sides(
        sides, args.repeats, lambda side, rep: run_side(side, assets, workdir, f"{side}-{rep}", args),
        lambda r: f"{r['tokens_per_s']:.0f} trained tokens/s, step {r['step_s']:.3f} s, waited {r['wait_s']:.3f} s",
    )  # fmt: skip
    base = runs["lockstep"]
    return {
        "benchmark": "async",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "versions": versions(),
        "runs": runs,
        "tokens_per_s": {side: spread([r["tokens_per_s"] for r in runs[side]]) for side in sides},
        "ratio_over_lockstep": {
            side: spread(
                [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs[side], base, strict=True)]
            )
            for side in sides[1:]
        },
        # what overlapping buys at best: the lock-step step over its slower side
        "ideal_ratio": spread([r["step_s"] / max(r["generate_s"], r["train_s"] + r["sync_s"]) for r in base]),
        "staleness_histogram": {
            side: dict(sorted(Counter(round(s) for r in runs[side] for s in r["staleness"]).items()))
            for side in sides
        },
        "reward_curve": {
            side: [statistics.median(step) for step in zip(*(r["reward"] for r in runs[side]), strict=True)]
            for side in sides
        },
    }


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"GRPO, mode both: 1 trainer rank on CPUs {cfg['trainer_cpus']}, 1 rollout worker (HF engine) on CPUs "
        f"{cfg['rollout_cpus']}; {cfg['prompts']} prompts x {cfg['group']} x {cfg['max_tokens']} tokens, "
        f"steps {WARM_STEPS + 1}-{WARM_STEPS + cfg['steps']} of each run measured, {cfg['repeats']} alternating "
        f"repeats. {result['machine']['cpu']}.",
        "",
        "| side | trained tokens/s (median) | / lock-step: min / median / max | staleness of the steps (count) | "
        "last reward |",
        "|---|---:|---:|---|---:|",
    ]
    for side, tps in result["tokens_per_s"].items():
        ratio = result["ratio_over_lockstep"].get(side)
        cell = f"{ratio['min']:.2f} / **{ratio['median']:.2f}** / {ratio['max']:.2f}" if ratio else "1"
        hist = ", ".join(f"{k}: {v}" for k, v in result["staleness_histogram"][side].items())
        lines.append(
            f"| {side} | {tps['median']:.0f} | {cell} | {hist} | {result['reward_curve'][side][-1]:.3f} |"
        )
    ideal, lock = result["ideal_ratio"], result["runs"]["lockstep"]
    lines += [
        "",
        f"Lock-step's step: generate {statistics.median(r['generate_s'] for r in lock):.3f} s, train "
        f"{statistics.median(r['train_s'] for r in lock):.3f} s, sync {statistics.median(r['sync_s'] for r in lock):.3f} s "
        f"(medians): overlapping them gains at best {ideal['median']:.2f}x (its step over its slower side).",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Trained tokens/s per side (bars) and each side's reward per step (`rlcore bench async` and
    `rlcore bench tails`)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    sides = list(result["tokens_per_s"])
    left.bar(sides, [result["tokens_per_s"][s]["median"] for s in sides])
    left.set_ylabel("trained tokens/s (median over repeats)")
    for side in sides:
        right.plot(range(1, len(result["reward_curve"][side]) + 1), result["reward_curve"][side], label=side)
    right.set_xlabel("step")
    right.set_ylabel("reward (median over repeats)")
    right.legend()
    save_figure(fig, path)


def add_launch_args(
    parser: argparse.ArgumentParser, steps: int, prompts: int, group: int, max_tokens: int, out: str
) -> None:
    """The arguments of a benchmark made of launches against a rollout worker (launch_against_worker)."""
    parser.add_argument("--repeats", type=positive_int, default=2, help="alternating repeats of every side")
    parser.add_argument("--steps", type=positive_int, default=steps, help="measured steps per run")
    parser.add_argument("--prompts", type=positive_int, default=prompts, help="prompts per step")
    parser.add_argument("--group", type=positive_int, default=group, help="samples per prompt")
    parser.add_argument(
        "--max-tokens", type=positive_int, default=max_tokens, help="tokens per response (at most)"
    )
    parser.add_argument(
        "--trainer-cpus", type=cpu_list, default=[0], help="CPU ids for the launch and its trainer"
    )
    parser.add_argument("--rollout-cpus", type=cpu_list, default=[1], help="CPU ids for the rollout worker")
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds per launch")
    parser.add_argument("--out", default=out, help="where the JSON result goes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    add_launch_args(parser, steps=20, prompts=4, group=8, max_tokens=96, out=default_out("async.json"))
    parser.add_argument(
        "--staleness", type=int_list, default=[1, 2, 4], help="max_staleness of the async sides"
    )
    args = parser.parse_args(argv)
    check_separate_cpus(parser, args.trainer_cpus, args.rollout_cpus)
    if any(s < 1 for s in args.staleness):
        parser.error(f"--staleness {args.staleness}: each must be >= 1 (0 is lock-step, measured anyway)")
    with tempfile.TemporaryDirectory(prefix="rlcore-async-") as workdir:
        result = measure(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
