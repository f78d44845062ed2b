"""The `explorer` section: the rollout engines and the explorer's long-tail settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import bounded, choice
from .model import AuxiliaryModelConfig


@dataclass
class RolloutModelConfig:
    engine_type: str = choice("hf", "rlcore.rollout.engines:ENGINES", by_path=True)
    """Inference engine: a registered one, or a RolloutEngine subclass by import path 'pkg.mod:Class'
    (its constructor's keyword parameters are its options: rollout/engines/spec.py)."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    """The engine's own options, by its constructor's parameter names (e.g. a custom engine's); a key
    it does not take is refused where the engine is built. The settings below reach the engines that
    take them."""
    engine_num: int = bounded(1, ge=1)
    """Engines: rollout workers (mode both), or in mode colocate 1 (in trainer rank 0) or the trainer's
    ranks (one in each, every rank generating its share of a batch). An in-process vLLM engine is
    in every rank whenever there are several (it joins the trainer's world), and serves every stage
    of the launch."""
    tensor_parallel_size: int = bounded(1, ge=1)
    """GPUs one vLLM engine splits its model over (vllm only)."""
    max_batch_size: int = bounded(256, ge=1)
    """Sequences generated together in one engine call."""
    gpu_memory_utilization: float = bounded(0.9, gt=0.0, le=1.0)
    """Share of each GPU's memory vLLM may take for weights and KV cache (vllm on GPU)."""
    dtype: str = choice("auto", ("auto", "float32", "bfloat16", "float16"))
    """The engines' compute dtype; auto: model.dtype (the trainer's). Another one makes the engine's
    log-probs differ from the trainer's (a real rollout-training mismatch: rollout/logprob_diff_*,
    which algorithm.rollout_correction corrects for); the sync probe then accepts the coarser
    dtype's tolerance."""
    enforce_eager: bool = False
    """Decode without CUDA graphs: vLLM without CUDA graphs / torch.compile (always on CPU); the HF
    engine with its eager loop over a dynamic cache instead of graph replays over a static one (always
    on CPU). Slower decoding, faster start."""
    enable_sleep_mode: bool = False
    """Mode colocate on one GPU: vLLM frees its KV cache and offloads its weights while the trainer
    works, then wakes for the weight load and the next rollout (vllm on GPU). Also allowed in mode
    train, whose in-process engine only evaluates: it sleeps between evaluations."""
    max_restarts: int = bounded(3, ge=0)
    """How often `rlcore launch` restarts each rollout worker it started that exits unexpectedly
    (after 1, 2, 4, ... s); meanwhile its tasks go to the other workers, and it gets the current
    weights before it serves again. 0: never."""
    endpoints: list[str] = field(default_factory=list)
    """Rollout workers already running (host:port each, e.g. started with `rlcore rollout serve`);
    empty: `rlcore launch` starts `engine_num` workers on this machine (or, start_workers false,
    waits for them to join). Mode both only."""
    start_workers: bool = True
    """false: `rlcore launch` starts no rollout workers but waits (control.worker_start_timeout)
    for engine_num of them to join the run from other hosts (`rlcore rollout serve --register
    <controller host>:<control.run_port>`); they are followed like its own: one that stops
    answering is left out, and it rejoins when it answers again."""


@dataclass
class OverRolloutConfig:
    """Explore steps that do not wait for their slowest tasks (mode explore, and asynchronous
    `both`): a step proceeds once (1 - ratio) of a batch's tasks are done; the rest go on running
    and feed the next step."""

    ratio: float = bounded(0.0, ge=0.0, lt=1.0)
    """Share of a step's tasks it may leave running (0: a step waits for all of them)."""
    wait_after_min: float = bounded(0.0, ge=0.0)
    """Seconds a step still waits for the rest once that minimum is done."""


@dataclass
class DynamicTimeoutConfig:
    """A task's timeout follows the tasks seen so far (mode explore, and asynchronous `both`)."""

    enable: bool = False
    """Turn the dynamic timeout on (otherwise explorer.max_timeout bounds every task)."""
    ratio: float = bounded(3.0, gt=1.0)
    """A task may take this many times the running mean of the finished tasks' seconds (at
    least 1 s, at most explorer.max_timeout); one that takes longer is cut and retried."""


@dataclass
class ExplorerConfig:
    rollout_model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    eval_interval: int = bounded(0, ge=0)
    """Evaluate every N explore steps (0: only at the end of the stage)."""
    eval_on_startup: bool = False
    """Evaluate before the first step."""
    max_timeout: float = bounded(900.0, gt=0.0)
    """Seconds one rollout batch may take before it is an error; with the task scheduler (over_rollout
    or dynamic_timeout on), seconds one task may take before it is cut and retried."""
    max_retry_times: int = bounded(2, ge=0)
    """Retries of a failed rollout batch; with the task scheduler, of a failed or cut task, which
    is then left out of the run (counted in rollout/tasks_dropped)."""
    max_restarts: int = bounded(3, ge=0)
    """Asynchronous `both`: how often the explorer thread is restarted after it fails (after 1, 2,
    4, ... s), from the position it last saved (the step it failed in is explored again, the tasks
    then still running sent again); past it the run stops in one line. 0: never."""
    partial_rollout: bool = False
    """A weight update reaching a rollout worker interrupts its tasks' generation at the next token
    instead of waiting for it; each unfinished sequence then continues from its tokens so far under
    the new weights (its per-token log-probs are the weights' that sampled each token, which the
    off-policy correction reads; the experience keeps the version it started on, for staleness).
    Modes explore and asynchronous `both` on rollout workers, the hf and vllm engines (a vLLM call
    ends between two of its engine steps). Two rules restart at an
    interruption: presence/frequency penalties count the continuation's tokens only, and a stop
    string split across it is not seen (min_tokens, max_tokens and the repetition penalty hold)."""
    over_rollout: OverRolloutConfig = field(default_factory=OverRolloutConfig)
    dynamic_timeout: DynamicTimeoutConfig = field(default_factory=DynamicTimeoutConfig)
    auxiliary_models: list[AuxiliaryModelConfig] = field(default_factory=list)
    """OpenAI-compatible services workflows talk to, by name (a teacher, a judge, a user simulator)."""
