"""Rollout routing replay against none: `configs/qwen3_moe_r3.yaml` (a tiny Qwen3-MoE, a bfloat16 HF
engine, the float32 fsdp2 trainer) launched with `algorithm.router_replay=r3` and with `none`,
alternating, each repeat on its own seed (the same seed on both sides of a pair).

Per launch, over the GRPO stage's steps: the engine/trainer log-prob gap per token
(`rollout/logprob_diff_mean`, the mean over steps, and at step 1, where both sides of a pair explore
with the same weights and so the same rollouts), the worst token's gap (`rollout/logprob_diff_max`,
the mean over steps), the share of token routes the trainer's router would have chosen otherwise
(`rollout/routing_mismatch`, r3 only) and the held-out accuracy at the end. Per pair the ratio
r3 / none of the gaps; min / median / max over the repeats.

    rlcore bench routing                                        # 3 pairs, the recipe as shipped
    rlcore bench routing --repeats 1 --set stages.0.buffer.total_steps=200 --set stages.1.buffer.total_steps=10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
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
from rlcore.benchmarks.shared_machine import one_launch, stage_rows

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "qwen3_moe_r3.yaml"
)
SIDES = ("r3", "none")
RL_STAGE = "stage1_rl"


def gaps(root: str) -> dict[str, Any]:
    """The GRPO stage's gap measures of one launch's run folder (under `root`)."""
    rows = [r for r in stage_rows(root)[RL_STAGE] if "rollout/logprob_diff_mean" in r]
    if not rows:
        raise RuntimeError(f"the GRPO stage under {root} logged no rollout/logprob_diff_mean")
    mismatch = [r["rollout/routing_mismatch"] for r in rows if "rollout/routing_mismatch" in r]
    accuracy = [r["eval/test/accuracy"] for r in stage_rows(root)[RL_STAGE] if "eval/test/accuracy" in r]
    return {
        "gap_mean": statistics.mean(r["rollout/logprob_diff_mean"] for r in rows),
        "gap_step1": rows[0]["rollout/logprob_diff_mean"],
        "worst_mean": statistics.mean(r["rollout/logprob_diff_max"] for r in rows),
        "mismatch_mean": statistics.mean(mismatch) if mismatch else None,
        "mismatch_steps": len(mismatch),
        "accuracy": accuracy[-1] if accuracy else None,
        "steps": len(rows),
    }


def one_side(side: str, rep: int, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    overrides = [*args.overrides, f"algorithm.router_replay={side}", f"seed={args.seed + rep}"]
    launch = one_launch(args.config, overrides, workdir, side, rep, 0, args.timeout)
    return {"wall_s": launch["wall_s"], **gaps(os.path.join(workdir, f"{side}-{rep}"))}


def summarize(runs: dict[str, list[dict]]) -> dict[str, Any]:
    r3, none = runs["r3"], runs["none"]
    keys = ("gap_mean", "gap_step1", "worst_mean", "wall_s")
    return {
        **{k: {side: spread([r[k] for r in runs[side]]) for side in SIDES} for k in keys},
        "ratio": {k: spread([a[k] / b[k] for a, b in zip(r3, none, strict=True)]) for k in keys[:3]},
        "mismatch_mean": spread([r["mismatch_mean"] for r in r3]),
        "accuracy": {side: [r["accuracy"] for r in runs[side]] for side in SIDES},
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]

    rows = [
        ("log-prob gap per token, mean over steps", "gap_mean"),
        ("log-prob gap per token, step 1 (same rollouts)", "gap_step1"),
        ("worst token's gap, mean over steps", "worst_mean"),
    ]
    lines = [
        "# Rollout routing replay (r3) against none: the engine/trainer log-prob gap",
        "",
        f"Machine: {machine_line(result['machine'])}; {result['repeats']} pairs, sides alternating, seed "
        f"{result['seed']} + repeat on both sides of a pair; `rlcore launch "
        + " ".join([os.path.relpath(result["config"]), *result["overrides"]])
        + " algorithm.router_replay=r3|none`.",
        "",
        "| | r3 | none | r3 / none |",
        "|---|---|---|---|",
    ]
    for label, key in rows:
        lines.append(f"| {label} | {cell(s[key]['r3'], '.5f')} | {cell(s[key]['none'], '.5f')} | "
                     f"**{cell(s['ratio'][key], '.2f', 'x')}** |")  # fmt: skip
    lines += [
        f"| whole launch (s) | {cell(s['wall_s']['r3'], '.0f')} | {cell(s['wall_s']['none'], '.0f')} | |",
        "",
        f"Token routes the trainer would have chosen otherwise (r3): {cell(s['mismatch_mean'], '.4f')} of "
        f"those replayed. Held-out accuracy at the end, per repeat: r3 {s['accuracy']['r3']}, none "
        f"{s['accuracy']['none']}.",
    ]
    return "\n".join(lines)


def plot(path: str, result: dict[str, Any]) -> None:
    from rlcore.benchmarks.common import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    s = result["summary"]
    keys = ["gap_mean", "gap_step1", "worst_mean"]
    x = range(len(keys))
    for offset, side in ((-0.2, "r3"), (0.2, "none")):
        ax.bar([i + offset for i in x], [s[k][side]["median"] for k in keys], width=0.4, label=side)
    ax.set_xticks(list(x), ["gap (mean)", "gap (step 1)", "worst token"])
    ax.set_yscale("log")
    ax.set_ylabel("|log p engine - log p trainer|")
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlcore bench routing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3, help="pairs of launches (default: 3)")
    parser.add_argument("--seed", type=int, default=42, help="the first pair's seed (default: 42)")
    parser.add_argument("--config", default=CONFIG, help="the run (default: configs/qwen3_moe_r3.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="a config override for every launch (repeatable; default: none, the recipe as shipped)")  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one launch may take (default: 3600)"
    )
    parser.add_argument("--out", default=default_out("routing_replay.json"),
                        help="the JSON result; .md and .png beside it (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="rlcore-bench-routing-") as workdir:
        runs = run_sides(
            SIDES, args.repeats, lambda side, rep: one_side(side, rep, args, workdir),
            lambda r: f"gap {r['gap_mean']:.5f} (step 1 {r['gap_step1']:.5f}), {r['wall_s']:.0f} s",
        )  # fmt: skip
    result = {
        "machine": machine, "repeats": args.repeats, "seed": args.seed, "config": args.config,
        "overrides": args.overrides, "runs": runs, "summary": summarize(runs),
    }  # fmt: skip
    write_outputs(result, args.out, markdown(result), lambda p: plot(p, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
