"""bench trl's TRL side: TRL's configurations (TRL_CONFIGS), the settings each gives GRPOConfig, and
one GRPOTrainer run in a fresh process (`python trl_side.py --trl-worker SPEC RESULT`), timing each
step and its phases. vs_trl.py pairs these runs with rlcore's."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from rlcore.benchmarks.cli_args import resolved_dtype
from rlcore.benchmarks.common import LR, PHASES, run_worker
from rlcore.runtime.child import KEEP_FREED_MALLOC

TRL_CONFIGS = {
    "as-shipped": "float32 weights under bf16 autocast on a GPU, gradient checkpointing on (TRL's defaults)",
    "matched": "float32 weights under bf16 autocast on a GPU, gradient checkpointing off (as rlcore)",
    "bf16": "bfloat16 weights, gradient checkpointing off, model.generate",
    "bf16-cb": "bfloat16 weights, gradient checkpointing off, transformers' continuous batching (generate_batch)",
}
"""TRL's configurations (--trl-configs). The headline ratio is against the fastest of those that do
rlcore's work in rlcore's dtype (fair_configs); as-shipped is reported beside it."""


def fair_configs(dtype: str) -> tuple[str, ...]:
    """The TRL configurations that do rlcore's work in rlcore's dtype: checkpointing off; in
    bfloat16 with bfloat16 weights (as rlcore's model.dtype), in float32 as `matched`."""
    return ("bf16", "bf16-cb") if dtype == "bfloat16" else ("matched",)


def trl_settings(trl_config: str, dtype: str) -> tuple[str, dict[str, Any]]:
    """(the weights' dtype, GRPOConfig keywords) of one TRL configuration."""
    bf16 = trl_config.startswith("bf16")
    settings: dict[str, Any] = {"bf16": dtype == "bfloat16" or bf16}
    if trl_config != "as-shipped":
        settings["gradient_checkpointing"] = False
    if trl_config == "bf16-cb":
        settings["use_transformers_continuous_batching"] = True
    return ("bfloat16" if bf16 else "float32"), settings


def run_trl(
    model_dir: str, tasks: str, workdir: str, tag: str, trl_config: str, args: argparse.Namespace
) -> dict:
    """One TRL GRPOTrainer run in a fresh process (this file's --trl-worker mode)."""
    weights, settings = trl_settings(trl_config, resolved_dtype(args))
    spec = {"model_dir": model_dir, "tasks": tasks, "out_dir": os.path.join(workdir, f"trl-{tag}"),
            "prompts": args.prompts, "group": args.group, "max_tokens": args.max_tokens,
            "steps": args.steps + 1, "device": args.device, "weights": weights, "settings": settings}  # fmt: skip
    env = KEEP_FREED_MALLOC if args.trl_malloc == "keep-freed" else None
    result = run_worker(__file__, "--trl-worker", spec, workdir, f"trl-{tag}", args.run_timeout, env)
    steps = result["steps"][1:]
    return {
        "step_s": [s["step_s"] for s in steps],
        "tokens": [s["tokens"] for s in steps],
        "generate_s": [s["generate_s"] for s in steps],
        "train_s": [s["step_s"] - s["generate_s"] for s in steps],
        "generated_tokens": [s["completion_len"] * args.prompts * args.group for s in steps],
        "phases": {phase: [_trl_phase(phase, s) for s in steps] for phase in PHASES},
    }


def _trl_phase(phase: str, step: dict[str, float]) -> float:
    """TRL generates with the model it trains (no weight sync); its scoring pass holds the
    log-prob passes it needs; the update is the step minus generation-and-scoring."""
    parts = {
        "generate": step["generate_only_s"],
        "reward": step["reward_s"],
        "logprobs": max(0.0, step["generate_s"] - step["generate_only_s"] - step["reward_s"]),
        "forward_backward": max(0.0, step["step_s"] - step["generate_s"] - step["optimizer_s"]),
        "optimizer": step["optimizer_s"],
        "sync": 0.0,
        "other": 0.0,
    }
    return parts[phase]


def trl_worker(spec_path: str, result_path: str) -> None:
    """Runs in its own process: TRL's GRPOTrainer on the shared model and taskset, timing each step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlcore.core.types import Task
    from rlcore.rollout.rewards.compose import build_reward

    with open(spec_path) as f:
        spec = json.load(f)
    with open(spec["tasks"]) as f:
        rows = [json.loads(line) for line in f]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    composer = build_reward(["exact_match", "format"], [1.0, 0.1])

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float | None]:
        return [composer(c, Task("t", p, a))[0] for p, c, a in zip(prompts, completions, answer, strict=True)]

    timing: dict[str, float] = {
        "generate_s": 0.0,
        "generate_only_s": 0.0,
        "reward_s": 0.0,
        "optimizer_s": 0.0,
    }

    def timed(method: str, key: str) -> Any:
        """GRPOTrainer's `method`, adding its seconds to timing[key]."""

        def wrapper(self: Any, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return getattr(super(TimedGRPOTrainer, self), method)(*a, **k)
            finally:
                timing[key] += time.perf_counter() - start

        return wrapper

    class TimedGRPOTrainer(GRPOTrainer):
        _generate_and_score_completions = timed("_generate_and_score_completions", "generate_s")
        _generate = timed("_generate", "generate_only_s")
        _calculate_rewards = timed("_calculate_rewards", "reward_s")

    steps: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            for k in timing:
                timing[k] = 0.0
            self.start = time.perf_counter()

        def on_pre_optimizer_step(self, *_: Any, **__: Any) -> None:
            self.optimizer_start = time.perf_counter()

        def on_optimizer_step(self, *_: Any, **__: Any) -> None:
            timing["optimizer_s"] += time.perf_counter() - self.optimizer_start

        def on_step_end(self, *_: Any, **__: Any) -> None:
            steps.append({"step_s": time.perf_counter() - self.start, **timing})

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "num_tokens" in logs and steps:  # cumulative prompt + completion tokens
                steps[-1]["num_tokens"] = float(logs["num_tokens"])
                steps[-1]["completion_len"] = float(logs["completions/mean_length"])

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=getattr(torch, spec["weights"]))
    config = GRPOConfig(
        output_dir=spec["out_dir"],
        per_device_train_batch_size=spec["prompts"] * spec["group"],
        gradient_accumulation_steps=1,
        num_generations=spec["group"],
        max_completion_length=spec["max_tokens"],
        max_steps=spec["steps"],
        learning_rate=LR,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=spec["device"] == "cpu",
        seed=0,
        dataloader_num_workers=0,
        **spec["settings"],
    )
    trainer = TimedGRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
        callbacks=[StepTimer()],
    )  # fmt: skip
    trainer.train()
    previous = 0.0
    for s in steps:  # per-step tokens from the cumulative count
        total = s.get("num_tokens", previous)
        s["tokens"], previous = total - previous, total
    with open(result_path, "w") as f:
        json.dump({"steps": steps}, f)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--trl-worker"] or len(sys.argv) != 4:
        sys.exit("usage: trl_side.py --trl-worker SPEC RESULT (bench trl starts it)")
    trl_worker(sys.argv[2], sys.argv[3])
