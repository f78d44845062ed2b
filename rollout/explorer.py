"""The explorer: turns tasks into scored experiences on inference engines, and evaluates.

It runs on whatever `Rollout` the roof hands it: an engine in this process (local.py), rollout
workers over gRPC (remote.py), or an engine in every trainer rank (rlcore.runtime.colocated). The
loop above it does not know which.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ..client.base import RpcError
from ..core.config.plan import StagePlan
from ..core.config.schema import RLCoreConfig, RolloutArgs, TasksetConfig
from ..core.data.prompts import model_chat_template
from ..core.data.taskset import load_tasks, training_tasksets
from ..core.services import auxiliary_models
from ..core.step_metrics import sampled_eval_metrics
from ..core.types import Experience, SamplingParams, Task, WorkflowSpec, by_episode
from ..core.watchdog import deadline
from .engines import in_process
from .rewards.answer import extract_answer
from .rewards.compose import correctness_names
from .rewards.judge import JUDGE, judge_settings
from .rewards.reward_model import REWARD_MODEL, reward_model_settings

log = logging.getLogger("rlcore.explorer")


class Rollout(Protocol):
    """Where an explorer's tasks run."""

    bounded: bool
    """Whether `run` ends by itself within `timeout` (RPC deadlines, each rank's own watchdog), so
    a stalled engine is an error the rollout can handle (fail over); otherwise the explorer's
    watchdog ends the process when a batch overruns."""

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]: ...

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        """Each engine's greedy tokens and their log-probs for `prompt`: (engine name, tokens, log-probs)."""
        ...

    def report(self) -> dict[str, float]:
        """The last batch's rollout metrics (core.step_metrics.rollout_report)."""
        ...


def _vote_key(text: str) -> str:
    """What maj@n votes on: the response's <answer>, else its whole text (stripped)."""
    answer = extract_answer(text)
    return (answer if answer is not None else text).strip()


def rollout_seed(seed: int, explore_step: int, round_: int = 0) -> int:
    """The sampling seed of an explore step's rollout (engines derive theirs from it); rounds 1, 2,
    ... are the step's extra rounds (dynamic sampling)."""
    return seed * 100_003 + explore_step + round_ * 1_000_000_007


def sampling_params(
    args: RolloutArgs, n: int, default_max_tokens: int, seed: int | None, routed_experts: bool = False
) -> SamplingParams:
    """`routed_experts`: the engine records each token's experts (algorithm.router_replay r3)."""
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
        return_routed_experts=routed_experts,
    )


def workflow_spec(cfg: RLCoreConfig, ts: TasksetConfig) -> WorkflowSpec:
    return WorkflowSpec(
        reward_fn=list(ts.reward_fn),
        reward_weights=list(ts.reward_weights),
        max_prompt_tokens=cfg.model.max_prompt_tokens,
        apply_chat_template=cfg.model.apply_chat_template,
        chat_template=model_chat_template(cfg.model),
        system_prompt=ts.format.system_prompt,
        name=ts.default_workflow_type,
        args=dict(ts.workflow_args),
        auxiliary_models=auxiliary_models(cfg),
        judge=judge_settings(ts.judge) if JUDGE in ts.reward_fn else None,
        reward_model=reward_model_settings(ts.reward_model) if REWARD_MODEL in ts.reward_fn else None,
        reasoning_tags=list(ts.format.reasoning_tags),
        chat_template_kwargs=dict(cfg.model.chat_template_kwargs),
    )


def engine_in_every_rank(cfg: RLCoreConfig, plan: StagePlan, world: int) -> bool:
    """Whether every trainer rank holds an engine (evaluation stays on rank 0's): one per rank
    generating its share of a batch (plan.engine_per_rank: mode colocate with engine_num = the
    ranks); and any in-process engine that the ranks of a larger world must build together (vLLM,
    see rollout/engines/in_process.py), unless it only evaluates beside an explorer thread."""
    if plan.source == "explorer_thread":
        return False
    if plan.engine_per_rank:
        return True
    return world > 1 and cfg.explorer.rollout_model.engine_type in in_process.PROCESS_WIDE


class Explorer:
    def __init__(self, cfg: RLCoreConfig, rollout: Rollout, eval_rollout: Rollout | None = None):
        """`eval_rollout`: where evaluation runs, when not on `rollout` (an engine in every rank
        evaluates on rank 0's alone)."""
        self.cfg = cfg
        self.rollout = rollout
        self.eval_rollout = eval_rollout or rollout
        self.train_set = cfg.buffer.explorer_input.taskset
        self.train_spec = workflow_spec(cfg, self.train_set)
        # every training taskset by name (a mixture's each run with their own workflow and sampling)
        self.train_sets = {ts.name: (ts, workflow_spec(cfg, ts)) for _, ts in training_tasksets(cfg)}
        self.eval_sets = []
        for i, ts in enumerate(cfg.buffer.explorer_input.eval_tasksets):
            spec = workflow_spec(cfg, ts)
            correctness = correctness_names(spec.reward_fn)
            self.eval_sets.append(
                (ts, load_tasks(ts, f"buffer.explorer_input.eval_tasksets[{i}]"), spec, correctness)
            )

    def _run(
        self, rollout: Rollout, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec
    ) -> list[Experience]:
        retries, timeout = self.cfg.explorer.max_retry_times, self.cfg.explorer.max_timeout
        for attempt in range(retries + 1):
            try:
                if rollout.bounded:
                    return rollout.run(tasks, sampling, spec, timeout)
                with deadline(timeout, "a rollout batch", "explorer.max_timeout"):
                    return rollout.run(tasks, sampling, spec, timeout)
            except (RuntimeError, OSError, RpcError) as e:  # engine/worker failures; bad input is not retried
                if attempt == retries or (isinstance(e, RpcError) and e.code.name == "INVALID_ARGUMENT"):
                    raise
                log.warning("rollout batch failed (%s); retry %d/%d", e, attempt + 1, retries)
        raise AssertionError("unreachable")

    def report(self) -> dict[str, float]:
        """The last training rollout's metrics: engines that generated, the slowest one's timings."""
        return self.rollout.report()

    def plan(self, tasks: list[Task], seed: int) -> list[tuple[Task, SamplingParams, WorkflowSpec]]:
        """Each training task with the sampling (repeat_times samples) and workflow of its taskset
        (a mixture's tasks have their own)."""
        n, out = self.cfg.algorithm.repeat_times, []
        routed = self.cfg.algorithm.router_replay == "r3"
        for t in tasks:
            ts, spec = self.train_sets[self._source(t)]
            sampling = sampling_params(ts.rollout_args, n, self.cfg.model.max_response_tokens, seed, routed)
            out.append((t, sampling, spec))
        return out

    def _source(self, task: Task) -> str:
        """The training taskset a task runs with: its own (a mixture's), else the taskset's."""
        return task.source if task.source in self.train_sets else self.train_set.name

    def explore(self, tasks: list[Task], seed: int) -> list[Experience]:
        """repeat_times episodes per task, task by task; a mixture's tasks run per taskset (its
        workflow, rewards and sampling), one rollout call each, and come back in task order."""
        by_source: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            by_source.setdefault(self._source(t), []).append(i)
        n = self.cfg.algorithm.repeat_times
        per_task: list[list[Experience]] = [[] for _ in tasks]
        planned = self.plan(tasks, seed)
        for indices in by_source.values():
            _, sampling, spec = planned[indices[0]]
            episodes = by_episode(self._run(self.rollout, [tasks[i] for i in indices], sampling, spec))
            for j, i in enumerate(indices):  # an episode may be several samples (Experience.episode_id)
                per_task[i] = [e for samples in episodes[j * n : (j + 1) * n] for e in samples]
        return [e for group in per_task for e in group]

    def evaluate(self, seed: int) -> dict[str, float]:
        """Mean reward, each reward function's mean (with several), accuracy (mean of correctness
        rewards) and response length per eval taskset; with repeat_times n > 1 also avg@n, pass@k
        and maj@n (core/step_metrics.py)."""
        metrics: dict[str, float] = {}
        for ts, tasks, spec, names in self.eval_sets:
            start = time.perf_counter()
            k = ts.repeat_times
            sampling = sampling_params(ts.rollout_args, k, self.cfg.model.max_response_tokens, seed)
            samples = self._run(self.eval_rollout, tasks, sampling, spec)
            exps = [episode[-1] for episode in by_episode(samples)]  # an episode's reward, once
            prefix = f"eval/{ts.name}/"
            metrics[prefix + "reward_mean"] = sum(e.reward for e in exps) / len(exps)
            if len(spec.reward_fn) > 1:  # what each contributed (a judge's score beside the answer's)
                for fn in spec.reward_fn:
                    scores = [e.reward_components[fn] for e in exps if fn in e.reward_components]
                    if scores:  # a workflow may score with its own components instead
                        metrics[f"{prefix}{fn}_mean"] = sum(scores) / len(scores)
            names = [
                n for n in names if all(n in e.reward_components for e in exps)
            ]  # a workflow's own scoring: none
            if names:
                correct = [sum(e.reward_components[n] for n in names) / len(names) for e in exps]
                metrics[prefix + "accuracy"] = sum(correct) / len(correct)
                if k > 1:  # a sample is right when every correctness reward gave it full marks
                    right = [[c >= 1.0 - 1e-9 for c in correct[i : i + k]] for i in range(0, len(exps), k)]
                    said = [
                        [_vote_key(e.response_text) for e in exps[i : i + k]] for i in range(0, len(exps), k)
                    ]
                    metrics.update({prefix + k: v for k, v in sampled_eval_metrics(right, said).items()})
            metrics[prefix + "response_len_mean"] = sum(e.model_tokens for e in samples) / len(exps)
            metrics[prefix + "time_s"] = time.perf_counter() - start
        return metrics

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        """Each engine's greedy tokens and log-probs for `prompt` (the sync probe)."""
        return self.rollout.probe(prompt, max_tokens)
