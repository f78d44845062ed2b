"""The run's shape, decided once: `plan_run(stages) -> RunPlan`, pure and torch-free.

A config says what the user wants (mode, synchronizer.asynchronous, trainer.remote, the algorithm,
where engines live, how weights travel); the plan says what the run does with it, stage by stage:

    source      where a step's experiences come from:
                  rollouts          explored in lock-step on the stage's engines (modes both, colocate)
                  explorer_thread   an explorer thread of this launch, through an in-memory buffer
                                    (asynchronous both)
                  buffer            the experience buffer an explore launch writes (mode train: RL, or
                                    DPO on the pairs it forms with algorithm.dpo.pairs buffer)
                  explore           none: this stage explores into the buffer (a mode-explore launch)
                  responses, pairs  the taskset's own rows (SFT, DPO)
                  evaluation        none: the stage evaluates only (mode bench)
    engines     where the trainer launch's engines of the stage live: workers (rollout workers, over
                gRPC), in_process (in the trainer's ranks), none
    weights     how the trainer's weights reach those engines (synchronizer.sync_method, "auto"
                resolved): nccl (a process group), checkpoint (an HF folder), memory (an in-process
                copy), publish (an explore launch's workers load the folders the trainer publishes),
                none; `publishes`: the trainer also publishes versions for an explorer, and
                `explorer_weights` says how they reach a decoupled run's explorer (folders, or
                pushed over a process group)
    trainer     local (this launch's trainer world), remote (trainer.remote), tinker (trainer.remote
                names a Tinker service: the engines are its samplers, loading the sampler paths it
                saves by the checkpoint transport), none (an explore launch)
    algorithm   the preset-filled algorithm section and the passes it needs

This module (with shape_checks.py, which refuses the impossible combinations) is the only one that
reads `mode`, `synchronizer.asynchronous` or `trainer.remote`; everything else reads the plan. The
launch writes it to <run>/launch/plan.json; `rlcore config show --plan` prints it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from .errors import ConfigError
from .host_checks import tinker_url
from .schema import RLCoreConfig

Source = Literal["rollouts", "explorer_thread", "buffer", "explore", "responses", "pairs", "evaluation"]
EngineHome = Literal["workers", "in_process", "none"]
TrainerKind = Literal["local", "remote", "tinker", "none"]
TrainsOn = Literal["rollouts", "responses", "pairs"]
TrainedModel = Literal["policy", "reward"]
ExplorerWeights = Literal["publish", "nccl", ""]
Role = Literal["trainer", "remote", "explorer"]
SOURCES: tuple[Source, ...] = get_args(Source)
ENGINES: tuple[EngineHome, ...] = get_args(EngineHome)
ROLES: tuple[Role, ...] = get_args(Role)

SYNCING_MODES = ("both", "colocate")
"""Modes whose trainer sends its weights to engines by synchronizer.sync_method."""


@dataclass(frozen=True)
class Passes:
    """What a step of the stage's algorithm computes beyond the policy's forward and backward."""

    reference: bool
    """The reference model's log-probs (a KL term, KL in the reward, DPO, maxent's target)."""
    old_logprobs: bool
    """The trainer recomputes the log-probs the ratio divides by (else the engine's are used)."""
    correction: bool
    """Rollout correction: weights (or rejections) from the recomputed log-probs against the
    engine's (algorithm.rollout_correction)."""
    routing_replay: bool
    """The trainer's forward replays (r3) or records (r2) the routers' choices (algorithm.router_replay)."""
    extra: tuple[str, ...]
    """The step passes the algorithm runs beside the policy (Algorithm.passes: critic, experts...)."""
    refill: bool
    """Dynamic sampling: groups that teach nothing are replaced by fresh rounds (dapo)."""

    def names(self) -> tuple[str, ...]:
        """The passes a trainer runs for a step beside the policy's forward and backward, by name:
        reference, old_logprobs, correction, routing_replay, then the algorithm's own (`extra`)."""
        flags = (("reference", self.reference), ("old_logprobs", self.old_logprobs),
                 ("correction", self.correction), ("routing_replay", self.routing_replay))  # fmt: skip
        return (*(name for name, on in flags if on), *self.extra)


TRAINER_PASSES: dict[TrainerKind, frozenset[str]] = {"tinker": frozenset({"old_logprobs"})}
"""The passes (Passes.names) a kind of trainer runs, for the kinds that do not run them all: a
Tinker service recomputes log-probs by a forward and nothing else. rlcore's own trainer, local or
served, runs every pass. Each trainer class declares its own as `runs_passes` (a unit test holds
the two equal); the config check refuses the rest in one rule (shape_checks.py)."""


ADAPTER_ENGINES = frozenset({"hf"})
"""The registered engines that merge an adapter-only sync into their base weights (RolloutEngine.
merges_adapters: a unit test holds the two equal)."""
ADAPTER_TRANSPORTS = ("nccl", "checkpoint")
"""The transports auto sends an adapter alone over: to rollout workers. Not memory (an engine in the
trainer's process: no wire to spare, and the engine would keep a copy of the bases) nor publish
(folders explorers also start from); lora_sync adapter asks for memory too."""


def lora_sync_of(cfg: RLCoreConfig, weights: str, trainer: TrainerKind) -> str:
    """How a LoRA stage's trainer sends its weights over `weights` (synchronizer.lora_sync, auto
    resolved): adapter, merged, or "" (no LoRA, or no transport that may carry an adapter alone)."""
    if not cfg.model.lora_configs or trainer not in ("local", "remote") or weights not in (*ADAPTER_TRANSPORTS, "memory"):
        return ""
    choice = cfg.synchronizer.lora_sync
    if choice != "auto":
        return choice
    wire = weights in ADAPTER_TRANSPORTS
    return "adapter" if wire and cfg.explorer.rollout_model.engine_type in ADAPTER_ENGINES else "merged"


def passes_refused(trainer: TrainerKind, passes: Passes) -> list[str]:
    """The passes of `passes` that a trainer of kind `trainer` does not run, in order."""
    runs = TRAINER_PASSES.get(trainer)
    return [] if runs is None else [name for name in passes.names() if name not in runs]


def passes_of(algo: Any) -> Passes:
    """What a step of `algo` (AlgorithmConfig, preset filled) computes beyond the policy's."""
    from ..algorithms import algorithm_of, reads_reference, step_passes, trains_on

    rollouts = trains_on(algo) == "rollouts"
    return Passes(
        reference=reads_reference(algo),
        old_logprobs=bool(algo.do_old_log_prob_compute) and rollouts,
        correction=algo.rollout_correction.kind != "none" and rollouts,
        routing_replay=algo.router_replay != "none",
        extra=step_passes(algo),
        refill=algorithm_of(algo).refills(algo),
    )


@dataclass(frozen=True)
class StagePlan:
    index: int
    name: str
    source: Source
    """Where a step's experiences come from (see the module's docstring)."""
    engines: EngineHome
    """Where this launch's engines of the stage live, for rollouts and evaluation (ENGINES)."""
    explorer_engines: EngineHome
    """Where the stage's explorer thread generates (asynchronous both: workers; else none)."""
    on_workers: bool
    """Whether the stage's engines, when it has any, are rollout workers: mode both and explore, and
    every stage of a remote trainer (which hosts no engine)."""
    weights: str
    """How the trainer's weights reach `engines`: a transport of rlcore.weights.TRANSPORTS (nccl,
    checkpoint, memory, publish, or one added there) with synchronizer.sync_method's "auto" resolved,
    or none."""
    lora_sync: str
    """With LoRA, what `weights` carries after a transport's first sync: adapter (the factors alone,
    weights/adapter.py) or merged; "" without LoRA or over a transport that carries merged weights
    only (lora_sync_of)."""
    publishes: bool
    """The trainer publishes its weights as folders for an explorer (source buffer or explorer_thread)."""
    explorer_weights: ExplorerWeights
    """How a decoupled run's trainer (source buffer) gets its weights to the explore launch's rollout
    workers, and how that launch (source explore) expects them: publish (every version a folder the
    explorer has its workers load; synchronizer.sync_method auto or checkpoint) or nccl (the first
    version a folder the workers start from, every later one pushed to the workers the explorer
    registers, over a process group: NCCL on GPU, gloo on CPU; a folder again whenever no group
    forms); "" for the other sources."""
    trainer: TrainerKind
    """local, remote (trainer.remote), tinker (trainer.remote tinker://...) or none (the stage runs in an
    explore launch)."""
    trains_on: TrainsOn
    """rollouts, responses (SFT) or pairs (DPO, reward_model)."""
    trained_model: TrainedModel
    """What the stage trains: policy (a causal LM), or reward (algorithm_type reward_model: a scalar
    head on the trunk, which no engine holds: the stage has no engines, evaluates on its eval
    tasksets' pairs by the trainer's scores, and its export feeds no later stage's policy)."""
    passes: Passes
    max_staleness: int | None
    """synchronizer.max_staleness with its default filled (asynchronous both: 1), in policy versions
    (optimizer steps) everywhere: the trainer drops experiences generated more than this many versions
    before the step that trains them (lock-step, or algorithm.sample_strategy staleness_control on a
    buffer), sync_style explorer_driven syncs when the engines fall further behind, and an explorer on
    the buffer (mode explore, asynchronous both) explores step e only with weights of version >=
    e x (optimizer steps per explore step) - max_staleness, so that what it writes passes the filter."""
    schedules_tasks: bool
    """The explorer sends tasks one by one (explorer.over_rollout, explorer.dynamic_timeout)."""
    engine_per_rank: bool
    """Every trainer rank holds an engine that generates its share of a batch (mode colocate with
    explorer.rollout_model.engine_num > 1)."""

    @property
    def reads_buffer(self) -> bool:
        """The trainer takes its steps' experiences from an experience buffer."""
        return self.source in ("buffer", "explorer_thread")

    @property
    def explores(self) -> bool:
        """The trainer's loop explores each step itself (lock-step)."""
        return self.source == "rollouts"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagePlan:
        passes = d["passes"]
        for kind, given, fields in ((cls, d, STAGE_FIELDS), (Passes, passes, PASS_FIELDS)):
            if set(given) != fields:
                raise ValueError(
                    f"stage plan: {kind.__name__} fields {sorted(set(given) ^ fields)} differ from this rlcore's "
                    "(written by another rlcore version?); launch the run again"
                )
        return cls(**{**d, "passes": Passes(**{**passes, "extra": tuple(passes["extra"])})})


STAGE_FIELDS = frozenset(f.name for f in dataclasses.fields(StagePlan))
PASS_FIELDS = frozenset(f.name for f in dataclasses.fields(Passes))


@dataclass(frozen=True)
class RunPlan:
    role: Role
    """What this launch runs: trainer (its own trainer world), remote (the loop against
    trainer.remote), explorer (the stages in mode explore of a decoupled run)."""
    stages: list[StagePlan]
    """The stages this launch runs, in order."""
    worker_stages: list[int]
    """Indexes of the stages whose engines are rollout workers (their configs decide the workers)."""
    gpu_sharing: bool
    """Rollout workers may share GPUs with the trainer ranks (every worker stage syncs by checkpoint)."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunPlan:
        return cls(**{**d, "stages": [StagePlan.from_dict(s) for s in d["stages"]]})


# ---------------------------------------------------------------------- filled values


def decoupled(cfg: RLCoreConfig) -> bool:
    """Whether the stage's trainer or explorer meets its other half through the experience buffer
    (mode train or explore, or asynchronous both), whatever it trains on."""
    return cfg.mode in ("train", "explore") or cfg.synchronizer.asynchronous


def max_staleness(cfg: RLCoreConfig) -> int | None:
    """synchronizer.max_staleness, defaulting to 1 for asynchronous both (its explorer must be bounded)."""
    sc = cfg.synchronizer
    if sc.max_staleness is None and sc.asynchronous and cfg.mode == "both":
        return 1
    return sc.max_staleness


def filled(cfg: RLCoreConfig) -> RLCoreConfig:
    """`cfg` with what the plan decides for unset values written in: the algorithm's preset,
    do_old_log_prob_compute (off for a decoupled run's rollouts: they are off-policy by design) and
    max_staleness. Every later reader (trainer ranks, a remote TrainerService) gets these values."""
    from ..algorithms import trains_on, with_preset

    algo = with_preset(cfg.algorithm)
    if algo.do_old_log_prob_compute is None:
        algo = dataclasses.replace(
            algo, do_old_log_prob_compute=not (decoupled(cfg) and trains_on(algo) == "rollouts")
        )
    sync = dataclasses.replace(cfg.synchronizer, max_staleness=max_staleness(cfg))
    return dataclasses.replace(cfg, algorithm=algo, synchronizer=sync)


def syncs_engines(cfg: Any) -> bool:
    """Whether a stage (its config, or a section-level node of one) sends its weights to engines by
    synchronizer.sync_method."""
    return cfg.mode in SYNCING_MODES


def pushes_to_explorer(cfg: Any) -> bool:
    """Whether a decoupled run's stage (its config, or a section-level node of one) has the trainer
    push its weights to the explorer's workers over a group (synchronizer.sync_method nccl in modes
    train and explore; plan.explorer_weights)."""
    return cfg.mode in ("train", "explore") and cfg.synchronizer.sync_method == "nccl"


# ---------------------------------------------------------------------- the decisions


def on_workers(cfg: RLCoreConfig, served: bool = False) -> bool:
    return cfg.mode in ("both", "explore") or cfg.trainer.remote is not None or served


def source_of(cfg: RLCoreConfig, data: TrainsOn) -> Source:
    from ..algorithms import pairs_from_buffer

    if data != "rollouts" and not pairs_from_buffer(cfg.algorithm):  # DPO's pairs may be explored
        return data
    if cfg.mode == "bench":
        return "evaluation"
    if cfg.mode == "explore":
        return "explore"
    if cfg.mode == "train":
        return "buffer"
    return "explorer_thread" if cfg.synchronizer.asynchronous else "rollouts"


def plan_stage(cfg: RLCoreConfig, index: int = 0, name: str = "main", served: bool = False) -> StagePlan:
    """The plan of one stage whose config is validated and filled (`filled`). `served`: the stage
    is trained by a TrainerService (`rlcore trainer serve`), which hosts no engine: whatever its
    client's config says, the stage's engines are rollout workers and its trainer remote."""
    from ..algorithms import trains_on, trains_reward_model

    algo = cfg.algorithm
    data = cast(TrainsOn, trains_on(algo))  # Algorithm.trains_on: one of TrainsOn
    source = source_of(cfg, data)
    workers = on_workers(cfg, served)
    reward = trains_reward_model(algo)
    evaluates = bool(cfg.buffer.explorer_input.eval_tasksets) and not reward  # on engines
    engines: EngineHome
    explorer_engines: EngineHome
    if source == "explore":
        engines, explorer_engines = "workers", "none"
    elif source == "explorer_thread":  # the thread explores on the workers; the trainer evaluates in process
        engines, explorer_engines = ("in_process" if evaluates else "none"), "workers"
    elif source in ("rollouts", "evaluation") or evaluates:
        engines, explorer_engines = ("workers" if workers else "in_process"), "none"
    else:
        engines, explorer_engines = "none", "none"
    tinker = tinker_url(cfg.trainer.remote) is not None
    if source == "explore":  # the explore launch has its workers load the folders the trainer publishes
        weights = "publish"
    elif engines == "workers" and tinker:  # the service's sampler paths (shape_checks: no other method)
        weights = "checkpoint"
    elif engines == "workers":  # auto: a process group (shape_checks refuses memory here)
        method = cfg.synchronizer.sync_method
        weights = "nccl" if method == "auto" else method
    else:
        weights = "memory" if engines == "in_process" else "none"
    trainer: TrainerKind
    if source == "explore":
        trainer = "none"
    elif tinker:
        trainer = "tinker"
    else:
        trainer = "remote" if cfg.trainer.remote is not None or served else "local"
    passes = passes_of(algo)
    ex = cfg.explorer
    explorer_weights: ExplorerWeights = ""
    if source in ("buffer", "explore"):
        explorer_weights = "nccl" if pushes_to_explorer(cfg) else "publish"
    return StagePlan(
        index=index, name=name, source=source, engines=engines, explorer_engines=explorer_engines,
        on_workers=workers, weights=weights, lora_sync=lora_sync_of(cfg, weights, trainer),
        publishes=source in ("buffer", "explorer_thread"),
        explorer_weights=explorer_weights, trainer=trainer,
        trains_on=data, trained_model="reward" if reward else "policy", passes=passes,
        max_staleness=max_staleness(cfg),
        schedules_tasks=ex.over_rollout.ratio > 0 or ex.dynamic_timeout.enable,
        engine_per_rank=cfg.mode == "colocate" and ex.rollout_model.engine_num > 1,
    )  # fmt: skip


def explores_only(cfg: Any) -> bool:
    """Whether a launch of the (top-level) config `cfg` is a decoupled run's explorer (mode explore):
    it runs the stages in mode explore, and its trainer launch the others."""
    return bool(cfg.mode == "explore")


def launch_role(explorer: bool, first: StagePlan) -> Role:
    """What a launch runs (ROLES): a decoupled run's explorer (`explorer`, see explores_only); the
    loop against a remote trainer when its first stage's trainer is remote; else a trainer world."""
    if explorer:
        return "explorer"
    return "remote" if first.trainer in ("remote", "tinker") else "trainer"


def gpu_sharing(stages: list[StagePlan]) -> bool:
    """Whether rollout workers may share GPUs with the trainer ranks: every stage on workers loads
    weights from an HF folder (only mode both syncs workers by checkpoint, and such a stage always
    has engines), so no process group holds GPU memory on both sides."""
    return all(p.weights == "checkpoint" for p in stages if p.on_workers)


def plan_launch(stages: list[StagePlan], explorer: bool) -> RunPlan:
    """The plan of a launch of a config whose stages are planned as `stages`: an explorer's
    (`explorer`: mode explore, see explores_only) runs the stages in mode explore (its trainer runs
    the rest); any other launch runs every stage, none of them in mode explore."""
    if explorer:
        mine = [p for p in stages if p.source == "explore"]
        if not mine:
            raise ConfigError(
                "mode explore: every stage sets a mode of its own; leave mode unset in the stages to explore"
            )
        return plan_run("explorer", mine)
    for p in stages:
        if p.source == "explore":
            raise ConfigError(
                f"stages[{p.index}] ({p.name}): mode explore runs in a launch of its own: start this config with "
                "mode=explore beside one with mode=train (its trainer)"
            )
    return plan_run(launch_role(False, stages[0]), stages)


def plan_run(role: Role, stages: list[StagePlan]) -> RunPlan:
    """The plan of a launch in `role` (launch_role) running the stages planned as `stages`."""
    return RunPlan(
        role=role, stages=list(stages), worker_stages=[p.index for p in stages if p.on_workers],
        gpu_sharing=gpu_sharing(stages),
    )  # fmt: skip
