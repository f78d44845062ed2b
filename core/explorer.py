"""The explorer: turns tasks into scored experiences on inference engines, and evaluates.

It lives on trainer rank 0, or on every rank (engine_in_every_rank: mode colocate with
engine_num = the trainer's ranks, or an in-process vLLM engine in a trainer of several ranks), and
runs tasks either on an engine in its own process (mode colocate, and evaluation in modes train and
bench; weights copied in memory) or on rollout workers over gRPC (mode both: workers spawned by
`rlcore launch` or listed in explorer.rollout_model.endpoints, weights broadcast over a process
group). The loop above it does not know which.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import torch

from ..client.base import ClientOptions, RpcError
from ..rollout.engines import in_process
from ..rollout.rewards.compose import build_reward
from ..rollout.workflows.single_turn import SingleTurnWorkflow
from .config.schema import RLCoreConfig, RolloutArgs, TasksetConfig
from .data.taskset import load_tasks
from .types import Experience, SamplingParams, Task, WorkflowSpec
from .watchdog import deadline
from .weight_sync import TensorSpec

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


def workflow_spec(cfg: RLCoreConfig, ts: TasksetConfig) -> WorkflowSpec:
    return WorkflowSpec(
        reward_fn=list(ts.reward_fn),
        reward_weights=list(ts.reward_weights),
        max_prompt_tokens=cfg.model.max_prompt_tokens,
        apply_chat_template=cfg.model.apply_chat_template,
        chat_template=cfg.model.chat_template,
        system_prompt=ts.format.system_prompt,
    )


def engine_in_every_rank(cfg: RLCoreConfig, world: int) -> bool:
    """Whether every trainer rank holds an engine (evaluation stays on rank 0's): mode colocate with
    engine_num = the ranks, each generating its share of a batch; and any in-process engine that
    the ranks of a larger world must build together (vLLM, see rollout/engines/in_process.py)."""
    if cfg.mode == "both":
        return False
    if cfg.mode == "colocate" and cfg.explorer.rollout_model.engine_num > 1:
        return True
    return world > 1 and cfg.explorer.rollout_model.engine_type in in_process.PROCESS_WIDE


class LocalRollout:
    """An engine in this process; weights arrive by an in-memory copy.

    `reused`: an earlier stage of this launch built the engine (one that lives as long as the
    process, see rollout/engines/in_process.py), so it holds that stage's weights until the first
    sync."""

    def __init__(self, cfg: RLCoreConfig, model_path: str, device: str):
        rm = cfg.explorer.rollout_model
        dtype = (
            cfg.model.dtype if cfg.model.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
        )
        self.engine, self.reused = in_process.acquire(
            rm.engine_type, model_path, device=device, dtype=dtype, max_model_len=cfg.model.max_model_len,
            max_batch_size=rm.max_batch_size, gpu_memory_utilization=rm.gpu_memory_utilization,
            enforce_eager=rm.enforce_eager, enable_sleep_mode=rm.enable_sleep_mode, seed=cfg.seed,
        )  # fmt: skip
        self._workflows: dict[str, SingleTurnWorkflow] = {}
        self.sleeps = rm.enable_sleep_mode
        self.timing: dict[str, float] = {}  # the last batch's workflow timing

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]:
        key = json.dumps(asdict(spec), sort_keys=True)
        if key not in self._workflows:
            self._workflows[key] = SingleTurnWorkflow(
                self.engine, self.engine.tokenizer, build_reward(spec.reward_fn, spec.reward_weights or None),
                max_prompt_tokens=spec.max_prompt_tokens, apply_chat_template=spec.apply_chat_template,
                chat_template=spec.chat_template, system_prompt=spec.system_prompt,
            )  # fmt: skip
        self._awake()
        experiences = self._workflows[key].run(tasks, sampling, self.engine.policy_version)
        self.timing = dict(self._workflows[key].timing)
        if self.sleeps:  # the trainer gets the GPU until the next weight load
            self.engine.sleep()
        return experiences

    def load_weights(
        self, specs: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, float]:
        self.engine.pause()
        if self.sleeps:  # the weights come back first, the KV cache once they are loaded
            self.engine.wake_up(["weights"])
        self.engine.load_weights(weights, version)
        if self.sleeps:
            self.engine.wake_up(["kv_cache"])
        self.engine.resume()
        return {}

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        self._awake()
        (c,) = self.engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]
        return [("in-process", c.token_ids, c.logprobs)]

    def _awake(self) -> None:
        if self.sleeps and self.engine.sleeping:
            self.engine.wake_up()

    def close(self) -> None:
        if self.sleeps and not self.engine.sleeping:  # the GPU goes to whatever runs next
            self.engine.sleep()
        in_process.release(self.engine)


class RemoteRollout:
    """Rollout workers over gRPC: a batch is split across workers, weights go over a process group.

    Workers number versions over their own lifetime; a stage's optimizer step `s` is announced to
    them as version `base + s`, where `base` is one past what they served when the stage began.
    """

    def __init__(self, cfg: RLCoreConfig, endpoints: list[str], device: str, master_address: str):
        from ..client.rollout import RolloutClient
        from .weight_sender import WeightSender

        options = ClientOptions.from_control(cfg.control, timeout=cfg.explorer.max_timeout)
        self.clients = [RolloutClient(address, options) for address in endpoints]
        infos = [c.get_info() for c in self.clients]
        for address, info in zip(endpoints, infos, strict=True):
            if info.max_model_len < cfg.model.max_model_len:
                raise ValueError(
                    f"rollout worker {address} serves max_model_len {info.max_model_len} but "
                    f"model.max_model_len is {cfg.model.max_model_len}: start it with --max-model-len "
                    f"{cfg.model.max_model_len}"
                )
        self.base = max(info.policy_version for info in infos) + 1
        self.sender = WeightSender(
            self.clients,
            backend="nccl" if device == "cuda" else "gloo",
            timeout_s=cfg.synchronizer.sync_timeout,
            bucket_bytes=cfg.synchronizer.bucket_mb << 20,
            master_address=master_address,
            ranks=[max(1, info.weight_sync_ranks) for info in infos],
            checksums=cfg.synchronizer.checksums,
        )
        self._pool = ThreadPoolExecutor(max_workers=len(self.clients))
        log.info("exploring on %d rollout worker(s): %s", len(endpoints), ", ".join(endpoints))

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]:
        n = len(self.clients)
        bounds = [len(tasks) * i // n for i in range(n + 1)]  # contiguous, balanced shares

        def share(i: int) -> list[list[Experience]]:
            chunk = tasks[bounds[i] : bounds[i + 1]]
            out: list[list[Experience]] = [[] for _ in chunk]
            if not chunk:
                return out
            seeded = (
                sampling
                if sampling.seed is None
                else SamplingParams(**{**asdict(sampling), "seed": sampling.seed + 7919 * i})
            )
            for index, exps in self.clients[i].run_tasks(chunk, seeded, spec, timeout=timeout):
                out[index] = exps
            return out

        per_task = [exps for part in self._pool.map(share, range(n)) for exps in part]
        experiences = [e for exps in per_task for e in exps]
        for e in experiences:
            e.policy_version -= self.base
        return experiences

    def load_weights(
        self, specs: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, float]:
        return self.sender.send(specs, weights, self.base + version)

    def load_checkpoint(self, path: str, version: int) -> dict[str, float]:
        return self.sender.send_checkpoint(os.path.abspath(path), self.base + version)

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        """Greedy decode of `prompt` on every worker: (address, tokens, log-probs) each."""
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        out = []
        for c in self.clients:
            (completion,) = c.generate([prompt], sampling).completions[0]
            out.append((c.address, completion.token_ids, completion.logprobs))
        return out

    def close(self) -> None:
        self.sender.close()
        for c in self.clients:
            c.close()


class Explorer:
    def __init__(self, cfg: RLCoreConfig, model_path: str, device: str, endpoints: list[str] | None = None,
                 master_address: str = "127.0.0.1"):  # fmt: skip
        self.cfg = cfg
        self.rollout: Any = (
            RemoteRollout(cfg, endpoints, device, master_address)
            if endpoints
            else LocalRollout(cfg, model_path, device)
        )
        self.engine_reused = isinstance(self.rollout, LocalRollout) and self.rollout.reused
        self.train_set = cfg.buffer.explorer_input.taskset
        self.train_spec = workflow_spec(cfg, self.train_set)
        self.eval_sets = []
        for i, ts in enumerate(cfg.buffer.explorer_input.eval_tasksets):
            spec = workflow_spec(cfg, ts)
            correctness = build_reward(spec.reward_fn, spec.reward_weights or None).correctness_names
            self.eval_sets.append(
                (ts, load_tasks(ts, f"buffer.explorer_input.eval_tasksets[{i}]"), spec, correctness)
            )

    @property
    def remote(self) -> bool:
        return isinstance(self.rollout, RemoteRollout)

    def _run(self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec) -> list[Experience]:
        retries, timeout = self.cfg.explorer.max_retry_times, self.cfg.explorer.max_timeout
        for attempt in range(retries + 1):
            try:
                with deadline(timeout, "a rollout batch", "explorer.max_timeout"):
                    return self.rollout.run(tasks, sampling, spec, timeout)
            except (RuntimeError, OSError, RpcError) as e:  # engine/worker failures; bad input is not retried
                if attempt == retries or (isinstance(e, RpcError) and e.code.name == "INVALID_ARGUMENT"):
                    raise
                log.warning("rollout batch failed (%s); retry %d/%d", e, attempt + 1, retries)
        raise AssertionError("unreachable")

    def last_timing(self) -> dict[str, float]:
        """Seconds the last rollout batch spent in the engine and in reward functions, when the
        engine runs in this process (workers over gRPC report no split)."""
        return dict(getattr(self.rollout, "timing", {}))

    def explore(self, tasks: list[Task], seed: int) -> list[Experience]:
        sampling = sampling_params(
            self.train_set.rollout_args,
            self.cfg.algorithm.repeat_times,
            self.cfg.model.max_response_tokens,
            seed,
        )
        return self._run(tasks, sampling, self.train_spec)

    def evaluate(self, seed: int) -> dict[str, float]:
        """Mean reward, accuracy (mean of correctness rewards) and response length per eval taskset."""
        metrics: dict[str, float] = {}
        for ts, tasks, spec, names in self.eval_sets:
            start = time.perf_counter()
            sampling = sampling_params(ts.rollout_args, 1, self.cfg.model.max_response_tokens, seed)
            exps = self._run(tasks, sampling, spec)
            prefix = f"eval/{ts.name}/"
            metrics[prefix + "reward_mean"] = sum(e.reward for e in exps) / len(exps)
            if names:
                correct = [sum(e.reward_components[n] for n in names) / len(names) for e in exps]
                metrics[prefix + "accuracy"] = sum(correct) / len(correct)
            metrics[prefix + "response_len_mean"] = sum(len(e.response_token_ids) for e in exps) / len(exps)
            metrics[prefix + "time_s"] = time.perf_counter() - start
        return metrics

    def load_weights(
        self, specs: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, float]:
        return self.rollout.load_weights(specs, weights, version)

    def load_checkpoint(self, path: str, version: int) -> dict[str, float]:
        """Have the rollout workers load an HF folder as `version` (synchronizer.sync_method checkpoint)."""
        assert self.remote, "sync_method checkpoint needs rollout workers (mode both)"
        return self.rollout.load_checkpoint(path, version)

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        """Each engine's greedy tokens and log-probs for `prompt` (the sync probe)."""
        return self.rollout.probe(prompt, max_tokens)

    def close(self) -> None:
        self.rollout.close()
