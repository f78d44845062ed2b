"""Every algorithm of the menu on the same task, from the same SFT checkpoint, with the same budget.

The quickstart recipe (`--base`) gives the task, the model and the SFT warm-up: its first stage runs
once, and every algorithm's RL stage starts from that stage's final weights. An algorithm's RL stage
is the stage named `rl` of its recipe (`configs/algorithms/NAME.yaml`, each built on the quickstart;
`grpo` is the quickstart's own), with `buffer.total_steps` set by `--steps` when given and `seed`
set per run. Each (algorithm, seed) is a fresh `rlcore launch`; within a seed the algorithms run in
one order, the next seed in the reverse order, so the machine's drift does not favour one side.

Reported per run: the held-out accuracy at every evaluation (the stage's `explorer.eval_interval`,
before the first step and after the last) against steps and against the stage's wall time, the
responses explored (tasks x repeat_times, plus DAPO's extra dynamic-sampling rounds; 0 for offline
DPO, which trains on `batch_size` pairs a step) and the trained tokens. The table gives the final
accuracy per seed, its mean, and the gain over the SFT checkpoint; the plot, the mean curves.

A recipe that distills (its `rl` stage sets model.teacher_model_path: on_policy_distill) learns from
the grpo run of the first seed, trained earlier in the same benchmark from the same SFT checkpoint.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import yaml

from rlcore.benchmarks.cli_args import comma_names, int_list, positive_int
from rlcore.benchmarks.common import (
    default_out,
    machine_info,
    pyplot,
    run_logged,
    save_figure,
    versions,
    write_outputs,
)
from rlcore.core.config import load_config, read_recipe, resolve_stages

BASELINE = "grpo"
"""The quickstart's own RL stage; every other algorithm has a recipe in --recipes."""
RL_STAGE = "rl"
PROJECT = "bench_algorithms"


def algorithm_names(recipes: str) -> tuple[str, ...]:
    """grpo, then every recipe in the `recipes` folder, by name."""
    found = sorted(
        os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(recipes, "*.yaml"))
    )
    return (BASELINE, *[n for n in found if n != BASELINE])


def rl_stage(recipe: dict[str, Any], path: str) -> dict[str, Any]:
    stages = [s for s in recipe.get("stages") or [] if isinstance(s, dict) and s.get("name") == RL_STAGE]
    if not stages:
        raise ValueError(
            f"{path}: no stage named '{RL_STAGE}' (the benchmark runs that stage of each recipe)"
        )
    return dict(stages[0])


def write_config(recipe: dict[str, Any], stage: dict[str, Any], path: str, **top: Any) -> str:
    """`recipe` with `stage` as its only stage and the top-level keys `top` replaced."""
    cfg = {k: v for k, v in recipe.items() if k != "stages"}
    cfg.update(top)
    cfg["stages"] = [stage]
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def with_steps(stage: dict[str, Any], steps: int | None) -> dict[str, Any]:
    if steps is None:
        return stage
    return {**stage, "buffer": {**(stage.get("buffer") or {}), "total_steps": steps}}


def run_dir(root: str, name: str) -> str:
    """The run folder of a one-stage run (which is also its stage's folder)."""
    return os.path.join(root, PROJECT, name)


def final_export(stage_dir: str) -> str:
    """The HF export of the stage's last checkpoint."""
    steps = glob.glob(os.path.join(stage_dir, "global_step_*", "hf"))
    if not steps:
        raise RuntimeError(f"no HF export under {stage_dir}")
    return max(steps, key=lambda p: int(p.split("global_step_")[-1].split(os.sep)[0]))


def read_metrics(stage_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(stage_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def accuracy_key(rows: list[dict[str, Any]]) -> str:
    keys = sorted({k for r in rows for k in r if k.startswith("eval/") and k.endswith("/accuracy")})
    if not keys:
        raise RuntimeError("the stage logged no held-out accuracy (eval/<taskset>/accuracy)")
    return keys[0]


def summarise(
    rows: list[dict[str, Any]], batch_size: int, repeat_times: int, explores: bool
) -> dict[str, Any]:
    """One run's curve (step, wall seconds since the stage's first evaluation, accuracy), responses
    explored, pairs or rows trained offline, trained tokens."""
    key = accuracy_key(rows)
    evals = [r for r in rows if key in r]
    t0 = evals[0]["time"]
    steps = [r for r in rows if "perf/step_time_s" in r]
    explored = 0
    if explores:
        for r in steps:  # DAPO's dynamic sampling explores extra groups; the others batch_size
            groups = r.get("rollout/groups_kept", 0) + r.get("rollout/groups_dropped", 0) or batch_size
            explored += int(groups) * repeat_times
    return {
        "eval": key,
        "curve": [[r["step"], r["time"] - t0, r[key]] for r in evals],
        "start": evals[0][key],
        "final": evals[-1][key],
        "steps": len(steps),
        "wall_s": steps[-1]["time"] - t0 if steps else 0.0,
        "explored": explored,
        "offline_rows": 0 if explores else batch_size * len(steps),
        "trained_tokens": sum(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in steps),
    }


def launch(path: str, workdir: str, tag: str, timeout_s: float) -> str:
    """`rlcore launch path` with the recipes' assets under `workdir`; its run folder."""
    env = {"RLCORE_CHECKPOINT_DIR": workdir}  # the recipes' assets are made once, under it
    cmd = [sys.executable, "-m", "rlcore.cli", "launch", path]
    run_logged(cmd, os.path.join(workdir, f"{tag}.log"), f"rlcore launch {tag}", timeout_s, env)
    return run_dir(workdir, tag)


def run_sft(args: argparse.Namespace, workdir: str) -> str:
    """The base recipe's first stage, once; the HF export every algorithm starts from."""
    base = read_recipe(args.base)
    sft = dict(base["stages"][0])
    if args.sft_steps is not None:
        sft = with_steps(sft, args.sft_steps)
    print(f"SFT warm-up (stage '{sft.get('name')}' of {args.base}) ...", flush=True)
    t0 = time.perf_counter()
    path = write_config(base, sft, os.path.join(workdir, "sft.yaml"), project=PROJECT, name="sft")
    checkpoint = final_export(launch(path, workdir, "sft", args.run_timeout))
    print(f"  done in {time.perf_counter() - t0:.0f} s: {checkpoint}", flush=True)
    return checkpoint


def teacher(args: argparse.Namespace, workdir: str, name: str) -> str:
    """The teacher a distilling recipe learns from in the benchmark: the baseline's (grpo) final
    export of the first seed, trained from the same SFT checkpoint earlier in this benchmark."""
    tag = f"{BASELINE}_seed{args.seeds[0]}"
    if BASELINE not in args.algorithms or not os.path.isdir(run_dir(workdir, tag)):
        raise SystemExit(
            f"rlcore bench algorithms: {name} distills from the {BASELINE} run of seed {args.seeds[0]}: include "
            f"{BASELINE} in --algorithms (it runs first)"
        )
    return final_export(run_dir(workdir, tag))


def run_algorithm(
    name: str, seed: int, checkpoint: str, args: argparse.Namespace, workdir: str
) -> dict[str, Any]:
    """The `rl` stage of `name`'s recipe from `checkpoint` with `seed`; its summary."""
    recipe_path = args.base if name == BASELINE else os.path.join(args.recipes, f"{name}.yaml")
    recipe = read_recipe(recipe_path)
    stage = with_steps(rl_stage(recipe, recipe_path), args.steps)
    if (stage.get("model") or {}).get("teacher_model_path"):
        stage = {**stage, "model": {**stage["model"], "teacher_model_path": teacher(args, workdir, name)}}
    tag = f"{name}_seed{seed}"
    model = {**(recipe.get("model") or {}), "model_path": checkpoint, "scratch": {"enabled": False}}
    path = write_config(recipe, stage, os.path.join(workdir, f"{tag}.yaml"),
                        project=PROJECT, name=tag, seed=seed, model=model)  # fmt: skip
    resolved = resolve_stages(load_config(path), check_paths=False)[0]
    cfg = resolved.config
    rows = read_metrics(launch(path, workdir, tag, args.run_timeout))
    return summarise(rows, cfg.buffer.batch_size, cfg.algorithm.repeat_times, explores=resolved.plan.explores)


def measured_in(workdir: str | None, name: str, measure: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """`measure(folder)`'s result, its runs in `workdir` (kept) or in a temporary folder (removed)."""
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
        return measure(os.path.abspath(workdir))
    with tempfile.TemporaryDirectory(prefix=f"rlcore-bench-{name}-") as folder:
        return measure(folder)


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    checkpoint = run_sft(args, workdir)
    runs: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in args.algorithms}
    order = list(args.algorithms)
    total, done = len(order) * len(args.seeds), 0
    for seed in args.seeds:
        for name in order:
            t0 = time.perf_counter()
            r = runs[name][str(seed)] = run_algorithm(name, seed, checkpoint, args, workdir)
            done += 1
            print(f"  [{done}/{total}] seed {seed} {name}: {100 * r['start']:.1f}% -> {100 * r['final']:.1f}% "
                  f"after {r['steps']} steps, stage {r['wall_s']:.0f} s (launch {time.perf_counter() - t0:.0f} s)",
                  flush=True)  # fmt: skip
        order.reverse()
    return {
        "benchmark": "algorithms",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "versions": versions(),
        "sft_checkpoint_accuracy": statistics.mean(r["start"] for per in runs.values() for r in per.values()),
        "runs": runs,
    }


def _mean(runs: dict[str, dict[str, Any]], key: str) -> float:
    return statistics.mean(r[key] for r in runs.values())


def markdown(result: dict[str, Any]) -> str:
    cfg, seeds = result["config"], [str(s) for s in result["config"]["seeds"]]
    sft = result["sft_checkpoint_accuracy"]
    first = next(iter(next(iter(result["runs"].values())).values()))
    lines = [
        f"Held-out accuracy ({first['eval']}, greedy) after each algorithm's RL stage, from the same SFT "
        f"checkpoint at {100 * sft:.1f}%; seeds {', '.join(seeds)}; {result['machine']['cpu']}. Explored: "
        "responses generated over the stage (offline: pairs trained on). Wall: the stage's own time, "
        "first evaluation to last step, mean over seeds.",
        "",
        "| algorithm | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | gain (points) | steps | explored | wall s |",
        "|---|" + "---:|" * (len(seeds) + 5),
    ]
    for name, runs in result["runs"].items():
        finals = [f"{100 * runs[s]['final']:.1f}%" for s in seeds]
        mean = _mean(runs, "final")
        explored = _mean(runs, "explored")
        budget = f"{explored:,.0f}" if explored else f"offline: {_mean(runs, 'offline_rows'):,.0f}"
        lines.append(
            f"| {name} | " + " | ".join(finals) + f" | {100 * mean:.1f}% | {100 * (mean - sft):+.1f} | "
            f"{_mean(runs, 'steps'):.0f} | {budget} | {_mean(runs, 'wall_s'):.0f} |"
        )
    if cfg.get("steps"):
        lines += ["", f"RL stages cut to {cfg['steps']} steps (`--steps`)."]
    return "\n".join(lines)


def mean_curve(runs: dict[str, Any], column: int) -> tuple[list[float], list[float]]:
    """(x, accuracy) averaged over seeds at each evaluation (runs of one algorithm evaluate at the same
    steps; wall times are averaged too)."""
    curves = [r["curve"] for r in runs.values()]
    n = min(len(c) for c in curves)
    xs = [statistics.mean(c[i][column] for c in curves) for i in range(n)]
    ys = [statistics.mean(c[i][2] for c in curves) for i in range(n)]
    return xs, ys


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    colors = plt.get_cmap("tab20").colors  # one colour per algorithm (the default cycle has 10)
    for i, (name, runs) in enumerate(result["runs"].items()):
        style = "--" if name == BASELINE else "-"
        for ax, column in ((by_step, 0), (by_time, 1)):
            xs, ys = mean_curve(runs, column)
            ax.plot(xs, [100 * y for y in ys], style, color=colors[2 * i % 20 + i // 10], marker="o",
                    markersize=3, label=name)  # fmt: skip
    by_step.set_xlabel("RL step")
    by_time.set_xlabel("wall time of the RL stage, s")
    by_step.set_ylabel("held-out accuracy, % (mean over seeds)")
    by_step.axhline(100 * result["sft_checkpoint_accuracy"], color="grey", linewidth=0.8)
    by_time.axhline(100 * result["sft_checkpoint_accuracy"], color="grey", linewidth=0.8)
    by_time.legend(fontsize=8, loc="lower right", ncol=2)
    fig.suptitle(f"the algorithm menu from one SFT checkpoint, seeds {result['config']['seeds']}")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--base", default="configs/quickstart.yaml", help="the recipe with the task and SFT stage"
    )
    parser.add_argument("--recipes", default="configs/algorithms", help="folder of the algorithms' recipes")
    parser.add_argument("--algorithms", default=None, help="comma-separated (default: grpo and every recipe)")
    parser.add_argument(
        "--seeds", type=int_list, default=[42, 43], help="comma-separated seeds of the RL stages"
    )
    parser.add_argument("--steps", type=positive_int, default=None, help="RL steps (default: each recipe's)")
    parser.add_argument(
        "--sft-steps", type=positive_int, default=None, help="SFT steps (default: the base's)"
    )
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per launch")
    parser.add_argument("--workdir", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--out", default=default_out("algorithms.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    for flag, path in (("--base", args.base), ("--recipes", args.recipes)):
        if not os.path.exists(path):
            parser.error(f"{flag} {path}: not found (run from a checkout of rlcore, or pass the path)")
    known = algorithm_names(args.recipes)
    args.algorithms = (
        list(known)
        if args.algorithms is None
        else comma_names(parser, "--algorithms", args.algorithms, known)
    )
    result = measured_in(args.workdir, "algorithms", lambda workdir: measure(args, workdir))
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
