"""Difficulty filtering against none on a taskset whose one half the model (nearly) always solves:
the rollouts each needs to reach a held-out accuracy, in a lock-step and in a decoupled run.

The quickstart recipe (`--base`) gives the model, the SFT warm-up (its first stage, run once, or
`--sft-checkpoint`) and the RL stage (its `rl` stage, GRPO, at `--lr`: the quickstart's own rate
learns this task within the first epoch, before any task has a history to filter by). The RL stage's
tasks are `--tasks` problems of the quickstart's arithmetic, every other one without a carry (the SFT
warm-up's demonstrations always get those right, so most of their groups are solved by every sample
and teach nothing) and the others with one (which the demonstrations forget 70% of the time); the
held-out set is `--heldout` test problems with a carry.
Per (mode, seed) the RL stage runs twice from the SFT checkpoint, without and with
buffer.explorer_input.task_selection.difficulty_filter (too_easy `--too-easy`, too_hard null: a
never-solved task is kept), the two in alternating order. Mode lockstep is one `rlcore launch` (mode both); mode
decoupled is a mode-explore and a mode-train launch side by side over the file buffer.

Reported per run: the held-out accuracy at every evaluation against the rollouts explored so far
(the tasks each step drew x repeat_times) and the tasks the filter skipped. The target of a (mode, seed) is
90% of the unfiltered run's gain over the SFT checkpoint (start + 0.9 x (final - start)); the saving
is the ratio of the rollouts the two runs needed to first reach it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Literal

from rlcore.benchmarks.algorithms import (
    accuracy_key,
    measured_in,
    read_metrics,
    rl_stage,
    run_sft,
    write_config,
)
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
from rlcore.core.config import read_recipe

PROJECT = "bench_algorithms"
"""The SFT warm-up's project (algorithms.run_sft); the RL runs share it."""
MODES = ("lockstep", "decoupled")
VARIANTS = ("no_filter", "filter")
EASY_WORDS = {"no_carry": "without a carry (which the SFT warm-up mostly gets right)",
              "one_digit": "one-digit sums without a carry (which the SFT warm-up all but always gets right)",
              "solved": "without a carry and rewarded as solved whatever the response (solved_or_answer)"}  # fmt: skip
GAIN_SHARE = 0.9
"""The target: this share of the unfiltered run's gain over the SFT checkpoint."""


def carries(prompt: str) -> bool:
    """Whether the sum 'a+b=' carries from the ones column."""
    a, b = prompt.rstrip("=").split("+")
    return int(a) % 10 + int(b) % 10 >= 10


def solved_or_answer(response: str, task: Any) -> float:
    """`--easy solved`'s reward: a task of the solved half (its row's `solved` column) pays 1.1 for
    any response, as a task the policy always solves does (its group has zero advantage); the others
    the quickstart's exact_match + 0.1 x format."""
    from rlcore.rollout.rewards.answer import exact_match, format_reward

    if task.metadata.get("solved"):
        return 1.1
    return exact_match(response, task) + 0.1 * format_reward(response, task)


def easy(prompt: str, kind: str) -> bool:
    """Whether 'a+b=' is of the easy half: `no_carry` (no carry from the ones column) or
    `one_digit` (that, with both numbers below 10: the SFT warm-up's samples all but always solve it);
    `solved` is `no_carry`, its rows marked solved (solved_or_answer)."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    return not carries(prompt) and (kind in ("no_carry", "solved") or (a < 10 and b < 10))


def write_tasks(workdir: str, tasks: int, heldout: int, easy_kind: str = "no_carry") -> tuple[str, str]:
    """(training taskset, held-out taskset): `tasks` training problems alternating easy (`easy_kind`)
    and with a carry, and `heldout` test problems with a carry (the quickstart's arithmetic, max
    operand 49)."""
    from rlcore.core.data.synthetic import write_arithmetic_taskset

    parts: dict[str, list[dict[str, Any]]] = {}
    sizes: tuple[tuple[Literal["train", "test"], int], ...] = (("train", 2000), ("test", 500))
    for part, n in sizes:
        path = os.path.join(workdir, f"all_{part}.jsonl")
        write_arithmetic_taskset(path, part=part, num_tasks=n, max_operand=49, seed=0)
        with open(path) as f:
            parts[part] = [json.loads(line) for line in f]
    solved = [r for r in parts["train"] if easy(r["prompt"], easy_kind)]
    hard = [r for r in parts["train"] if carries(r["prompt"])]
    if tasks // 2 > min(len(solved), len(hard)):
        raise SystemExit(f"rlcore bench curriculum: --tasks {tasks} needs more {easy_kind} problems than the 2000 training ones give ({len(solved)})")
    if easy_kind == "solved":
        solved = [{**r, "solved": True} for r in solved]
    train = [row for pair in zip(solved[: tasks // 2], hard[: tasks // 2], strict=True) for row in pair]
    held = [r for r in parts["test"] if carries(r["prompt"])][:heldout]
    paths = os.path.join(workdir, "half_solved.jsonl"), os.path.join(workdir, "carry_heldout.jsonl")
    for path, rows in zip(paths, (train, held), strict=True):
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return paths


def rl_config(args: argparse.Namespace, workdir: str, checkpoint: str, tasks: tuple[str, str], mode: str,
              variant: str, seed: int) -> tuple[str, str]:  # fmt: skip
    """The RL stage's config of one run, written into `workdir`; (its path, its tag)."""
    recipe = read_recipe(args.base)
    stage = rl_stage(recipe, args.base)
    base_ts = recipe["buffer"]["explorer_input"]["taskset"]
    taskset = {**base_ts, "name": "half_solved", "path": tasks[0], "generator": None, "generator_args": {}}
    if args.easy == "solved":  # the easy half always solved, by its reward
        taskset.update(reward_fn=["rlcore.benchmarks.curriculum:solved_or_answer"], reward_weights=[1.0])
    if args.temperature is not None:
        taskset["rollout_args"] = {**(base_ts.get("rollout_args") or {}), "temperature": args.temperature}
    heldout = {"name": "carry", "path": tasks[1], "rollout_args": {"temperature": 0.0, "max_tokens": 8}}
    selection = {"difficulty_filter": {"enable": variant == "filter", "too_easy": args.too_easy, "too_hard": None,
                                       "readmit_after": args.readmit_after, "refill": not args.no_refill}}  # fmt: skip
    buffer = {**(stage.get("buffer") or {}), "batch_size": args.batch_size, "total_steps": args.steps, "total_epochs": 1000,
              "explorer_input": {"taskset": taskset, "eval_tasksets": [heldout], "task_selection": selection}}  # fmt: skip
    if mode == "decoupled":
        buffer["trainer_input"] = {"experience_buffer": {"storage_type": "file"}}
    stage = {**stage, "buffer": buffer, "explorer": {"eval_on_startup": True, "eval_interval": args.eval_interval}}
    if args.lr is not None:
        algorithm = stage.get("algorithm") or {}
        stage["algorithm"] = {**algorithm, "optimizer": {**(algorithm.get("optimizer") or {}), "lr": args.lr}}
    stage.pop("mode", None)
    tag = f"{mode}_{variant}_seed{seed}"
    model = {**(recipe.get("model") or {}), "model_path": checkpoint, "scratch": {"enabled": False}}
    recipe["buffer"]["explorer_input"] = {"taskset": taskset}  # the base's eval tasksets are not this bench's
    path = write_config(recipe, stage, os.path.join(workdir, f"{tag}.yaml"), project=PROJECT, name=tag, seed=seed,
                        model=model, **({"synchronizer": {"max_staleness": 1}} if mode == "decoupled" else {}))  # fmt: skip
    return path, tag


def launch_run(path: str, tag: str, mode: str, workdir: str, timeout_s: float) -> str:
    """One run: a lock-step launch, or a decoupled run's two launches side by side; its run folder."""
    env = {**os.environ, "RLCORE_CHECKPOINT_DIR": workdir}
    cmd = [sys.executable, "-m", "rlcore.cli", "launch", path]
    if mode == "lockstep":
        run_logged([*cmd, "mode=both"], os.path.join(workdir, f"{tag}.log"), f"rlcore launch {tag}", timeout_s, env)
    else:
        logs = [open(os.path.join(workdir, f"{tag}_{side}.log"), "w") for side in ("train", "explore")]
        procs = [
            subprocess.Popen([*cmd, f"mode={side}"], stdout=log, stderr=subprocess.STDOUT, env=env)
            for side, log in zip(("train", "explore"), logs, strict=True)
        ]
        deadline = time.monotonic() + timeout_s
        try:
            for side, proc in zip(("train", "explore"), procs, strict=True):
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                if code != 0:
                    raise RuntimeError(f"rlcore launch {tag} mode={side} exited with {code}; see {workdir}/{tag}_{side}.log")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            for log in logs:
                log.close()
    return os.path.join(workdir, PROJECT, tag)


def summarise(run_dir: str, batch_size: int, repeat_times: int) -> dict[str, Any]:
    """One run's curve [step, rollouts explored, held-out accuracy] and the tasks its filter skipped.
    Rollouts explored by an evaluation: lock-step, its step's and the earlier steps' (each its tasks
    drawn, tasks/drawn, or batch_size without the filter, x repeat_times); decoupled, the rollouts the
    trainer took by then (its steps' buffer/experiences: each explored group is trained on, and the
    explorer's lead at that moment is timing, not cost; the places of skipped tasks hold none)."""
    rows = read_metrics(run_dir)
    key = accuracy_key(rows)
    evals = [r for r in rows if key in r]
    explorer = os.path.join(run_dir, "explorer")
    decoupled = os.path.isfile(os.path.join(explorer, "metrics.jsonl"))
    explored = read_metrics(explorer) if decoupled else rows
    spent = [(r["step"], r.get("tasks/drawn", batch_size) * repeat_times) for r in explored if "rollout/effective_groups" in r]

    trained = [(r["step"], r["buffer/experiences"]) for r in rows if "buffer/experiences" in r]

    def by(r: dict[str, Any]) -> float:
        return sum(n for step, n in (trained if decoupled else spent) if step <= r["step"])

    return {
        "eval": key,
        "curve": [[r["step"], by(r), r[key]] for r in evals],
        "start": evals[0][key],
        "final": evals[-1][key],
        "skipped": sum(r.get("tasks/skipped_easy", 0) + r.get("tasks/skipped_hard", 0) for r in explored),
        "effective_groups_mean": statistics.mean(r["rollout/effective_groups"] for r in explored if "rollout/effective_groups" in r),
    }  # fmt: skip


def rollouts_to(curve: list[list[float]], target: float) -> float | None:
    """The rollouts explored by the first evaluation that reaches `target` (None: none does)."""
    return next((point[1] for point in curve if point[2] >= target - 1e-9), None)


def compare(pair: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A (mode, seed)'s target and the rollouts each variant needed to reach it."""
    plain = pair["no_filter"]
    target = plain["start"] + GAIN_SHARE * (plain["final"] - plain["start"])
    needed = {v: rollouts_to(pair[v]["curve"], target) for v in VARIANTS}
    ratio = needed["no_filter"] / needed["filter"] if needed["filter"] and needed["no_filter"] else None
    # (None also when the target is the start itself, reached before any rollout: nothing to compare)
    return {"target": target, "rollouts": needed, "saving": ratio}


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    checkpoint = args.sft_checkpoint or run_sft(args, workdir)
    tasks = write_tasks(workdir, args.tasks, args.heldout, args.easy)
    runs: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in args.modes}
    total, done, order = len(args.modes) * len(args.seeds) * 2, 0, list(VARIANTS)
    for mode in args.modes:
        for seed in args.seeds:
            pair: dict[str, Any] = {}
            for variant in order:
                t0 = time.perf_counter()
                path, tag = rl_config(args, workdir, checkpoint, tasks, mode, variant, seed)
                run_dir = launch_run(path, tag, mode, workdir, args.run_timeout)
                r = pair[variant] = summarise(run_dir, args.batch_size, args.repeat_times)
                done += 1
                print(f"  [{done}/{total}] {mode} seed {seed} {variant}: {100 * r['start']:.1f}% -> {100 * r['final']:.1f}%"
                      f", {r['skipped']:.0f} tasks skipped ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
            order.reverse()
            runs[mode][str(seed)] = {**pair, "compare": compare(pair)}
    return {"benchmark": "curriculum", "config": {k: v for k, v in vars(args).items() if k != "out"},
            "machine": machine_info(), "versions": versions(), "runs": runs}  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"Rollouts explored until the held-out accuracy (test problems with a carry, greedy) first reaches "
        f"{100 * GAIN_SHARE:.0f}% of the unfiltered run's gain over the SFT checkpoint; {cfg['tasks']} training "
        f"tasks, half of them {EASY_WORDS[cfg.get('easy', 'no_carry')]}, {cfg['steps']} GRPO steps of "
        f"{cfg['batch_size']} tasks x {cfg['repeat_times']} responses at lr {cfg['lr']:g}; filter too_easy "
        f"{cfg['too_easy']:g}, readmit_after {cfg['readmit_after']}, refill {str(not cfg.get('no_refill', False)).lower()}; "
        f"{result['machine']['cpu']}.",
        "",
        "| mode | seed | SFT start | target | final, no filter | final, filter | rollouts, no filter | rollouts, filter | saving | tasks skipped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, seeds in result["runs"].items():
        for seed, pair in seeds.items():
            c, plain, kept = pair["compare"], pair["no_filter"], pair["filter"]
            need = [f"{c['rollouts'][v]:,.0f}" if c["rollouts"][v] is not None else "not reached" for v in VARIANTS]
            saving = f"{c['saving']:.2f}x" if c["saving"] is not None else "-"
            lines.append(
                f"| {mode} | {seed} | {100 * plain['start']:.1f}% | {100 * c['target']:.1f}% | {100 * plain['final']:.1f}% "
                f"| {100 * kept['final']:.1f}% | {need[0]} | {need[1]} | {saving} | {kept['skipped']:.0f} |"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    modes = list(result["runs"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.6), sharey=True, squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, mode in zip(axes[0], modes, strict=True):
        for i, (seed, pair) in enumerate(result["runs"][mode].items()):
            for variant, style in (("no_filter", "--"), ("filter", "-")):
                curve = pair[variant]["curve"]
                ax.plot([p[1] for p in curve], [100 * p[2] for p in curve], style, color=colors[i], marker="o",
                        markersize=3, label=f"seed {seed}, {variant.replace('_', ' ')}")  # fmt: skip
            ax.axhline(100 * pair["compare"]["target"], color=colors[i], linewidth=0.6, linestyle=":")
        ax.set_title(f"{mode}")
        ax.set_xlabel("rollouts explored")
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("held-out accuracy (carry problems), %")
    easy = result["config"].get("easy", "no_carry")
    half = {"one_digit": "one-digit half", "solved": "always-solved half"}.get(easy, "no-carry half")
    refill = "" if not result["config"].get("no_refill") else ", refill false"
    fig.suptitle(f"difficulty filtering on a taskset with a {half} (too_easy {result['config']['too_easy']:g}{refill})")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base", default="configs/quickstart.yaml", help="the recipe with the model, SFT and RL stages")
    parser.add_argument("--modes", default="lockstep,decoupled", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--seeds", type=int_list, default=[42, 43], help="comma-separated seeds of the RL stages")
    parser.add_argument("--tasks", type=positive_int, default=32, help="training tasks (half without a carry)")
    parser.add_argument("--easy", choices=("no_carry", "one_digit", "solved"), default="no_carry",
                        help="the easy half: sums without a carry, only those of two one-digit numbers, or sums without "
                        "a carry rewarded as solved whatever the response (a half the policy always solves)")
    parser.add_argument("--heldout", type=positive_int, default=100, help="held-out problems with a carry")
    parser.add_argument("--steps", type=positive_int, default=40, help="RL steps per run")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="tasks per RL step")
    parser.add_argument("--eval-interval", type=positive_int, default=2, help="RL steps between evaluations")
    parser.add_argument("--lr", type=float, default=1e-5, help="the RL stage's learning rate (the quickstart's 1e-4 learns the task within its first epoch, before any task has a history)")
    parser.add_argument("--too-easy", type=float, default=1.0, help="difficulty_filter.too_easy: the pass rate that skips a task")
    parser.add_argument("--readmit-after", type=positive_int, default=8, help="difficulty_filter.readmit_after")
    parser.add_argument("--temperature", type=float, default=None,
                        help="the RL stage's sampling temperature (default: the base recipe's)")
    parser.add_argument("--no-refill", action="store_true",
                        help="difficulty_filter.refill false: a filtered step explores only its open tasks (smaller steps; "
                             "decoupled: the explorer puts a place for each skipped task, which the trainer drops)")
    parser.add_argument("--sft-checkpoint", default=None, help="an SFT export to start from (default: run the base's SFT stage)")
    parser.add_argument("--sft-steps", type=positive_int, default=None, help="SFT steps (default: the base's)")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per launch")
    parser.add_argument("--workdir", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--out", default=default_out("curriculum.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    if not os.path.exists(args.base):
        parser.error(f"--base {args.base}: not found (run from a checkout of rlcore, or pass the path)")
    args.modes = comma_names(parser, "--modes", args.modes, MODES)
    if args.tasks % 2 or args.tasks < 2 * args.batch_size:
        parser.error(f"--tasks {args.tasks}: an even number, at least twice --batch-size ({args.batch_size})")
    rl = rl_stage(read_recipe(args.base), args.base)
    args.repeat_times = int((rl.get("algorithm") or {}).get("repeat_times", 8))
    result = measured_in(args.workdir, "curriculum", lambda workdir: measure(args, workdir))
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
