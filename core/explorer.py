"""The explorer: turns tasks into scored experiences with an inference engine, and evaluates.

It lives on trainer rank 0 and holds an in-process engine whose weights are refreshed from the
strategy (sync_method memory).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

from ..rollout.engines import ENGINES
from ..rollout.rewards.compose import build_reward
from ..rollout.workflows.single_turn import SingleTurnWorkflow
from .config.schema import RLCoreConfig, RolloutArgs, TasksetConfig
from .data.taskset import load_tasks
from .types import Experience, SamplingParams, Task
from .watchdog import deadline

log = logging.getLogger("rlcore.explorer")


def sampling_params(args: RolloutArgs, n: int, default_max_tokens: int, seed: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        n=n,
        max_tokens=args.max_tokens or default_max_tokens,
        stop=list(args.stop),
        seed=seed,
    )


class Explorer:
    def __init__(self, cfg: RLCoreConfig, model_path: str, device: str):
        self.cfg = cfg
        rm = cfg.explorer.rollout_model
        engine_cls = ENGINES.resolve(rm.engine_type)
        dtype = (
            cfg.model.dtype if cfg.model.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
        )
        self.engine = engine_cls(
            model_path,
            device=device,
            dtype=dtype,
            max_model_len=cfg.model.max_model_len,
            max_batch_size=rm.max_batch_size,
        )
        self.train_set = cfg.buffer.explorer_input.taskset
        self.workflow = self._workflow(self.train_set)
        self.eval_sets = [
            (ts, load_tasks(ts, f"buffer.explorer_input.eval_tasksets[{i}]"), self._workflow(ts))
            for i, ts in enumerate(cfg.buffer.explorer_input.eval_tasksets)
        ]

    def _workflow(self, ts: TasksetConfig) -> SingleTurnWorkflow:
        return SingleTurnWorkflow(
            self.engine,
            self.engine.tokenizer,
            build_reward(list(ts.reward_fn), list(ts.reward_weights) or None),
            max_prompt_tokens=self.cfg.model.max_prompt_tokens,
            apply_chat_template=self.cfg.model.apply_chat_template,
            chat_template=self.cfg.model.chat_template,
            system_prompt=ts.format.system_prompt,
        )

    def _run(
        self, workflow: SingleTurnWorkflow, tasks: list[Task], sampling: SamplingParams
    ) -> list[Experience]:
        retries = self.cfg.explorer.max_retry_times
        for attempt in range(retries + 1):
            try:
                with deadline(self.cfg.explorer.max_timeout, "a rollout batch", "explorer.max_timeout"):
                    return workflow.run(tasks, sampling, self.engine.policy_version)
            except (RuntimeError, OSError) as e:  # engine failures; bad input (ValueError) is not retried
                if attempt == retries:
                    raise
                log.warning("rollout batch failed (%s); retry %d/%d", e, attempt + 1, retries)
        raise AssertionError("unreachable")

    def explore(self, tasks: list[Task], seed: int) -> list[Experience]:
        sampling = sampling_params(
            self.train_set.rollout_args,
            self.cfg.algorithm.repeat_times,
            self.cfg.model.max_response_tokens,
            seed,
        )
        return self._run(self.workflow, tasks, sampling)

    def evaluate(self, seed: int) -> dict[str, float]:
        """Mean reward, accuracy (mean of correctness rewards) and response length per eval taskset."""
        metrics: dict[str, float] = {}
        for ts, tasks, workflow in self.eval_sets:
            start = time.perf_counter()
            sampling = sampling_params(ts.rollout_args, 1, self.cfg.model.max_response_tokens, seed)
            exps = self._run(workflow, tasks, sampling)
            names = workflow.reward.correctness_names
            prefix = f"eval/{ts.name}/"
            metrics[prefix + "reward_mean"] = sum(e.reward for e in exps) / len(exps)
            if names:
                correct = [sum(e.reward_components[n] for n in names) / len(names) for e in exps]
                metrics[prefix + "accuracy"] = sum(correct) / len(correct)
            metrics[prefix + "response_len_mean"] = sum(len(e.response_token_ids) for e in exps) / len(exps)
            metrics[prefix + "time_s"] = time.perf_counter() - start
        return metrics

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.engine.pause()
        self.engine.load_weights(weights, version)
        self.engine.resume()
