"""What `synchronizer.rollout_ahead: 1` saves when generation and training have devices of their own.

Each repeat runs the same GRPO work twice, alternating: once on-policy (generate, then train) and
once with the rollout for step k+1 started on the rollout worker while the trainer trains on step k.
The trainer is a `rlcore trainer serve` world of one rank, driven through `trainer.remote` by an
`rlcore launch` whose loop and rollout worker run in their own processes. On a CPU machine each
side is confined to its own cores (`--trainer-cpus`, `--rollout-cpus`), standing in for separate
devices: without that, the two sides contend for the same cores and the overlap buys nothing.

Reported: the median step time of each run over the steps after the first two (step 1 warms up;
step 2 is the first whose rollout ran ahead) and before the last (it writes the stage's
checkpoint), its generate / train / sync / wait split, and per pair the step-time ratio
ahead / on-policy, min / median / max. The ideal ratio is max(generate, train + sync) over the
on-policy step.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
from typing import Any

from rlcore.benchmarks.cli_args import check_separate_cpus, cpu_list, positive_int
from rlcore.benchmarks.common import (
    GRPORun,
    default_out,
    machine_info,
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

SIDES = ("on_policy", "ahead")
WARM_STEPS = 2
"""Steps left out of each run's median at its start: the first warms up, the second is the first
one ahead. The last step is left out too: it writes the stage's checkpoint."""
TOKEN_ENV = ControlConfig.token_env
"""The variable the trainer and the launch read their shared control-plane token from."""


def start_trainer(root: str, cpus: set[int], env: dict[str, str], timeout_s: float) -> tuple[Any, str]:
    """`rlcore trainer serve` (1 rank, 1 thread) on `cpus`; the process and its address."""
    return start_server(
        ["trainer", "serve", "--ranks", "1", "--threads", "1"], root, "trainer", cpus, env, timeout_s
    )


def run_side(side: str, assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace) -> dict:
    """One launch of `side` against a fresh trainer; its measured steps."""
    root = os.path.join(workdir, tag)
    os.makedirs(root)
    env = {TOKEN_ENV: os.environ.get(TOKEN_ENV) or secrets.token_hex(16)}
    trainer, address = start_trainer(root, set(args.trainer_cpus), env, args.run_timeout)
    try:
        run = GRPORun(prompts=args.prompts, group=args.group, max_tokens=args.max_tokens, steps=args.steps)
        path = rlcore_config(*assets, root, run)
        with open(path) as f:
            cfg = json.load(f)
        cfg["stages"][0]["mode"] = "both"  # a rollout worker process, not the engine in the trainer
        cfg["trainer"]["remote"] = address
        cfg["buffer"]["total_steps"] = WARM_STEPS + args.steps + 1
        if side == "ahead":
            cfg["synchronizer"] = {"rollout_ahead": 1, "max_staleness": 1}
        with open(path, "w") as f:
            json.dump(cfg, f)
        cmd = [sys.executable, "-m", "rlcore.cli", "launch", path]
        log = os.path.join(root, "launch.log")
        run_logged(cmd, log, f"rlcore launch {tag}", args.run_timeout, env, set(args.rollout_cpus))
    finally:
        trainer.terminate()
        trainer.wait(timeout=60)
    rows = step_rows(root, WARM_STEPS + args.steps + 1, f"rlcore launch {tag}")[WARM_STEPS:-1]

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows)

    return {
        "step_s": median("perf/step_time_s"),
        "generate_s": median("perf/generate_s"),
        "train_s": median("perf/train_s"),
        "sync_s": median("perf/sync_s"),
        "ahead_wait_s": median("perf/rollout_ahead_wait_s"),
        "staleness_mean": median("rollout/staleness_mean"),
    }


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    assets = prepare(workdir, num_tasks=args.prompts * (WARM_STEPS + args.steps + 1) * 2)
    runs = run_sides(
        SIDES, args.repeats, lambda side, rep: run_side(side, assets, workdir, f"{side}-{rep}", args),
        lambda r: f"step {r['step_s']:.3f} s (generate {r['generate_s']:.3f}, train {r['train_s']:.3f}, "
        f"wait {r['ahead_wait_s']:.3f})",
    )  # fmt: skip
    on, ahead = runs["on_policy"], runs["ahead"]
    ideal = [max(r["generate_s"], r["train_s"] + r["sync_s"]) / r["step_s"] for r in on]
    return {
        "benchmark": "rollout_ahead",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "versions": versions(),
        "runs": runs,
        "step_s": {side: spread([r["step_s"] for r in runs[side]]) for side in SIDES},
        "ratio_ahead_over_on_policy": spread(
            [a["step_s"] / o["step_s"] for a, o in zip(ahead, on, strict=True)]
        ),
        "ideal_ratio": spread(ideal),
        "staleness_ahead": spread([r["staleness_mean"] for r in ahead]),
    }


def markdown(result: dict[str, Any]) -> str:
    cfg, ratio, ideal = result["config"], result["ratio_ahead_over_on_policy"], result["ideal_ratio"]
    lines = [
        f"GRPO with `trainer.remote` (1 trainer rank on CPUs {cfg['trainer_cpus']}; the launch and its "
        f"rollout worker on CPUs {cfg['rollout_cpus']}), {cfg['prompts']} prompts x {cfg['group']} x "
        f"{cfg['max_tokens']} tokens, median of steps {WARM_STEPS + 1}-{WARM_STEPS + cfg['steps']} per run, "
        f"{cfg['repeats']} alternating pairs. {result['machine']['cpu']}.",
        "",
        "| side | step s (median over runs) | generate s | train s | sync s | waited for the rollout s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for side in SIDES:
        runs = result["runs"][side]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(
            f"| {side} | {med['step_s']:.3f} | {med['generate_s']:.3f} | {med['train_s']:.3f} | "
            f"{med['sync_s']:.3f} | {med['ahead_wait_s']:.3f} |"
        )
    lines += [
        "",
        f"Step time ahead / on-policy: {ratio['min']:.2f} / **{ratio['median']:.2f}** / {ratio['max']:.2f} "
        f"(min / median / max over pairs); ideal max(generate, train + sync) / step: {ideal['median']:.2f}. "
        f"Experiences trained ahead are {result['staleness_ahead']['median']:.1f} policy versions old.",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, side in enumerate(SIDES):
        runs = result["runs"][side]
        ax.scatter([i] * len(runs), [r["step_s"] for r in runs], label=side)
    ax.set_xticks(range(len(SIDES)), list(SIDES))
    ax.set_ylabel("step time, s (median per run)")
    ax.set_title(f"rollout_ahead: {result['ratio_ahead_over_on_policy']['median']:.2f}x the on-policy step")
    ax.set_ylim(bottom=0)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=positive_int, default=4, help="alternating pairs")
    parser.add_argument("--steps", type=positive_int, default=5, help="measured steps per run")
    parser.add_argument("--prompts", type=positive_int, default=8, help="prompts per step")
    parser.add_argument("--group", type=positive_int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per response (at most)")
    parser.add_argument("--trainer-cpus", type=cpu_list, default=[0], help="CPU ids for the trainer")
    parser.add_argument(
        "--rollout-cpus", type=cpu_list, default=[1], help="CPU ids for the launch and its worker"
    )
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds per launch")
    parser.add_argument("--out", default=default_out("rollout_ahead.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    check_separate_cpus(parser, args.trainer_cpus, args.rollout_cpus)
    with tempfile.TemporaryDirectory(prefix="rlcore-rollout-ahead-") as workdir:
        result = measure(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
