"""What partial rollouts (explorer.partial_rollout) buy when tasks left running generate long
responses: the weight load no longer waits for their engine call, so the engine is not held idle by
the load and new tasks start at once.

Asynchronous `both` with over-rollout (a step leaves up to --ratio of its tasks running into the
next one), on a taskset where a share of the tasks generate --max-tokens tokens and the rest
--short-tokens (`LongGenerationWorkflow`, EOS ignored so the lengths are exact). Two sides, the same
work, in alternating order: `wait` (a weight load waits for the engine call running) and `partial`
(it interrupts the call at its next token; the sequences continue under the new weights). The
rollout worker (`rlcore rollout serve`, HF engine) runs on --rollout-cpus and the launch with its
trainer on --trainer-cpus.

Reported per side: trained tokens/s over the measured steps (the ratio to `wait` per repeat, min /
median / max), the explorer's step and weight-load times (medians), the engine's idle seconds per
explore step (from the worker's GetInfo: the time from its first generation call to its last with
no call running, over the explore steps) and the sequences a load interrupted per explore step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
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
from rlcore.benchmarks.long_tails import explorer_rows, is_slow
from rlcore.core.types import Experience, SamplingParams, Task
from rlcore.rollout.workflows.single_turn import SingleTurnWorkflow

SIDES = ("wait", "partial")


class LongGenerationWorkflow(SingleTurnWorkflow):
    """An agent-like episode without an environment: a task in the long share (`long_fraction` of
    the task ids) generates the sampling's max_tokens over `turns` engine calls, `tool_s` seconds
    apart (a tool's latency), each call continuing the response so far; the others generate
    `short_tokens` in one call. EOS is ignored (`ignore_eos`, default true), so the lengths are
    exact. Calls of different tasks thus interleave on the worker, and a step ends (and a weight
    load comes) while some generate."""

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        fraction = args.get("long_fraction", 0.0)
        if not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
            raise ValueError(f"workflow_args.long_fraction must be a number in [0, 1]; got {fraction!r}")
        for key in ("short_tokens", "turns"):
            if not isinstance(args.get(key, 1), int) or args.get(key, 1) < 1:
                raise ValueError(f"workflow_args.{key} must be an integer >= 1; got {args.get(key)!r}")
        if not isinstance(args.get("ignore_eos", True), bool):
            raise ValueError(
                f"workflow_args.ignore_eos must be true or false; got {args.get('ignore_eos')!r}"
            )
        seconds = args.get("tool_s", 0.0)
        if not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"workflow_args.tool_s must be a number of seconds >= 0; got {seconds!r}")

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        fraction = float(self.args.get("long_fraction", 0.0))
        out: list[Experience] = []
        for task in tasks:
            long = is_slow(task.task_id, fraction)
            budget = (
                sampling.max_tokens
                if long
                else min(int(self.args.get("short_tokens", 1)), sampling.max_tokens)
            )
            turns = min(int(self.args.get("turns", 1)), budget) if long else 1
            out += self._episode(
                task,
                sampling,
                policy_version,
                [budget * (t + 1) // turns - budget * t // turns for t in range(turns)],
            )
        return out

    def _episode(
        self, task: Task, sampling: SamplingParams, version: int, per_turn: list[int]
    ) -> list[Experience]:
        """`sampling.n` responses of `task`, generated `per_turn` tokens a call (a response that
        stopped, on EOS unless `ignore_eos`, takes no more turns)."""
        prompt, ignore_eos = self.encode_prompt(task), bool(self.args.get("ignore_eos", True))
        first = replace(sampling, max_tokens=per_turn[0], ignore_eos=ignore_eos)
        (samples,) = self.engine.generate([prompt], first)
        tokens, logprobs = [list(c.token_ids) for c in samples], [list(c.logprobs) for c in samples]
        stopped = [c.finish_reason == "stop" for c in samples]
        for count in per_turn[1:]:
            going = [i for i, s in enumerate(stopped) if not s]
            if not going:
                break
            time.sleep(float(self.args.get("tool_s", 0.0)))
            more = replace(sampling, n=1, max_tokens=count, ignore_eos=ignore_eos)
            for i, (c,) in zip(
                going, self.engine.generate([prompt + tokens[i] for i in going], more), strict=True
            ):
                tokens[i] += c.token_ids
                logprobs[i] += c.logprobs
                stopped[i] = c.finish_reason == "stop"
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
        scored = self.reward.score_batch(texts, [task] * len(texts))
        return [
            Experience(prompt_token_ids=prompt, response_token_ids=t, logprobs=lp, reward=reward, group_id=task.task_id,
                       policy_version=version, finish_reason="stop" if done else "length", response_text=text,
                       reward_components=parts)
            for t, lp, text, done, (reward, parts) in zip(tokens, logprobs, texts, stopped, scored, strict=True)
        ]  # fmt: skip


def run_side(side: str, assets: tuple[str, str], workdir: str, tag: str, args: argparse.Namespace) -> dict:
    from rlcore.benchmarks.async_explore import launch_against_worker, summary
    from rlcore.client import ClientOptions, RolloutClient

    def configure(cfg: dict) -> None:
        cfg["synchronizer"] = {"asynchronous": True, "max_staleness": args.staleness}
        ts = cfg["buffer"]["explorer_input"]["taskset"]
        ts["default_workflow_type"] = f"{__name__}:LongGenerationWorkflow"
        ts["workflow_args"] = {"long_fraction": args.long_fraction, "short_tokens": args.short_tokens,
                               "turns": args.turns, "tool_s": args.tool_s}  # fmt: skip
        explorer = cfg["stages"][0]["explorer"]
        explorer["over_rollout"] = {"ratio": args.ratio, "wait_after_min": 0.0}
        explorer["partial_rollout"] = side == "partial"

    busy: list[float] = []

    def engine_time(address: str, token: str) -> None:
        with RolloutClient(address, ClientOptions(token=token, timeout=60)) as client:
            info = client.get_info()
        busy.extend([info.busy_s, info.busy_span_s, info.interrupted_sequences])

    flags = ("--partial-rollout",) if side == "partial" else ()
    root, rows = launch_against_worker(
        assets, workdir, tag, args, configure, worker_args=flags, on_worker=engine_time
    )
    explored = explorer_rows(root)
    loads = [r["perf/load_weights_s"] for r in explored if "perf/load_weights_s" in r]
    out = summary(rows)
    out.update(
        explore_step_s=statistics.median(r["perf/step_time_s"] for r in explored),
        load_s=statistics.median(loads) if loads else 0.0,
        idle_per_step_s=(busy[1] - busy[0]) / len(explored),
        engine_busy_frac=busy[0] / busy[1],
        interrupted_per_step=busy[2] / len(explored),
        tasks_left_running=statistics.fmean(r.get("rollout/tasks_left_running", 0.0) for r in explored),
    )
    return out


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    from rlcore.benchmarks.async_explore import WARM_STEPS

    assets = prepare(
        workdir, num_tasks=args.prompts * (WARM_STEPS + args.steps + 1) * 4, max_model_len=model_len(args.max_tokens)
    )  # fmt: skip
    runs = run_sides(
        SIDES, args.repeats, lambda side, rep: run_side(side, assets, workdir, f"{side}-{rep}", args),
        lambda r: f"{r['tokens_per_s']:.0f} trained tokens/s, explore step {r['explore_step_s']:.2f} s, weight load "
        f"{r['load_s']:.2f} s, engine idle {r['idle_per_step_s']:.2f} s/step, {r['interrupted_per_step']:.1f} "
        "sequences interrupted/step",
    )  # fmt: skip
    base = runs["wait"]
    return {
        "benchmark": "partial",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "versions": versions(),
        "runs": runs,
        "tokens_per_s": {side: spread([r["tokens_per_s"] for r in runs[side]]) for side in SIDES},
        "ratio_over_wait": spread(
            [p["tokens_per_s"] / w["tokens_per_s"] for p, w in zip(runs["partial"], base, strict=True)]
        ),
        "idle_per_step_s": {side: spread([r["idle_per_step_s"] for r in runs[side]]) for side in SIDES},
        "load_s": {side: spread([r["load_s"] for r in runs[side]]) for side in SIDES},
        "reward_curve": {
            side: [statistics.median(step) for step in zip(*(r["reward"] for r in runs[side]), strict=True)]
            for side in SIDES
        },
    }


def markdown(result: dict[str, Any]) -> str:
    from rlcore.benchmarks.async_explore import WARM_STEPS

    cfg = result["config"]
    lines = [
        f"GRPO, asynchronous both (max_staleness {cfg['staleness']}, over-rollout {cfg['ratio']}): 1 trainer rank on "
        f"CPUs {cfg['trainer_cpus']}, 1 rollout worker (HF engine) on CPUs {cfg['rollout_cpus']}; {cfg['prompts']} "
        f"prompts x {cfg['group']}; {cfg['long_fraction']:.1%} of the tasks generate {cfg['max_tokens']} tokens in "
        f"{cfg['turns']} calls {cfg['tool_s']:g} s apart, the others {cfg['short_tokens']} in one "
        f"(LongGenerationWorkflow); steps {WARM_STEPS + 1}-{WARM_STEPS + cfg['steps']} "
        f"of each run measured, {cfg['repeats']} alternating repeats. {result['machine']['cpu']}.",
        "",
        "| side | trained tokens/s (median) | / wait: min / median / max | explore step (s) | weight load (s) | "
        "engine idle per explore step (s) | sequences interrupted per explore step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side in SIDES:
        runs, ratio = result["runs"][side], result["ratio_over_wait"]
        cell = (
            f"{ratio['min']:.2f} / **{ratio['median']:.2f}** / {ratio['max']:.2f}"
            if side == "partial"
            else "1"
        )
        lines.append(
            f"| {side} | {result['tokens_per_s'][side]['median']:.0f} | {cell} | "
            f"{statistics.median(r['explore_step_s'] for r in runs):.2f} | {result['load_s'][side]['median']:.2f} | "
            f"{result['idle_per_step_s'][side]['median']:.2f} | "
            f"{statistics.median(r['interrupted_per_step'] for r in runs):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from rlcore.benchmarks.async_explore import add_launch_args, plot

    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    add_launch_args(parser, steps=10, prompts=8, group=4, max_tokens=256, out=default_out("partial.json"))
    parser.add_argument("--staleness", type=positive_int, default=2, help="synchronizer.max_staleness")
    parser.add_argument(
        "--long-fraction", type=float, default=0.25, help="share of the tasks that generate --max-tokens"
    )
    parser.add_argument(
        "--short-tokens", type=positive_int, default=16, help="tokens the other tasks generate"
    )
    parser.add_argument("--turns", type=positive_int, default=4, help="engine calls a long task generates in")
    parser.add_argument("--tool-s", type=float, default=0.05, help="seconds between a long task's calls")
    parser.add_argument("--ratio", type=float, default=0.25, help="explorer.over_rollout.ratio")
    args = parser.parse_args(argv)
    check_separate_cpus(parser, args.trainer_cpus, args.rollout_cpus)
    if not 0 <= args.long_fraction <= 1 or not 0 < args.ratio < 1 or args.tool_s < 0:
        parser.error("--long-fraction in [0, 1], --ratio in (0, 1) and --tool-s >= 0")
    with tempfile.TemporaryDirectory(prefix="rlcore-partial-") as workdir:
        result = measure(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
