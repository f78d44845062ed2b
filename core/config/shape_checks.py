"""The combinations of mode, synchronizer.asynchronous, trainer.remote and the rest that cannot run:
each refused in one line naming the key and the fix. With plan.py, the only module that reads those
three keys (plan.py decides what a valid combination does)."""

from __future__ import annotations

import dataclasses

from .errors import ConfigError
from .host_checks import check_address, tinker_url
from .plan import ADAPTER_ENGINES, TrainerKind, max_staleness, passes_of, passes_refused
from .schema import RLCoreConfig, TinkerConfig


def check_engines(cfg: RLCoreConfig) -> None:
    """Where the engines live and how weights reach them (checked before the control plane)."""
    if cfg.trainer.max_restarts and cfg.trainer.remote:
        raise ConfigError(
            "trainer.max_restarts restarts the trainer world a launch starts; with trainer.remote the "
            "TrainerService's host restarts it: set one of them"
        )
    _check_rollout_and_sync(cfg)


def check_shape(cfg: RLCoreConfig, data: str) -> None:
    """What the stage's mode runs with the algorithm (which trains on `data`: rollouts, responses or
    pairs) and the explorer's settings."""
    from ..algorithms import pairs_from_buffer

    algo = cfg.algorithm.algorithm_type
    if cfg.algorithm.dpo.pairs == "buffer":
        _check_explored_pairs(cfg, data)
    explored = data == "rollouts" or pairs_from_buffer(cfg.algorithm)  # what an explorer writes
    if cfg.mode in ("both", "colocate") and data != "rollouts":
        raise ConfigError(
            f"mode '{cfg.mode}' explores, and algorithm.algorithm_type {algo} trains on the taskset's own "
            f"{data} instead: set mode train (or an RL algorithm_type: grpo, ppo, rloo, ...)"
        )
    if cfg.mode == "explore" and not explored:
        raise ConfigError(
            f"mode explore writes rollouts for an RL algorithm; algorithm.algorithm_type {algo} trains on the "
            f"taskset's own {data}: set an RL algorithm_type (grpo, ppo, rloo, ...) or mode train"
            + (" (or algorithm.dpo.pairs buffer: DPO on pairs it explores)" if data == "pairs" else "")
        )
    if cfg.mode in ("train", "explore") and explored:
        _check_decoupled(cfg)
    if cfg.synchronizer.asynchronous:
        _check_asynchronous(cfg)
    _check_long_tails(cfg)
    if cfg.explorer.partial_rollout:
        _check_partial_rollout(cfg)
    _check_buffer_sampling(cfg, data)
    if tinker_url(cfg.trainer.remote) is not None:
        _check_tinker_algorithm(cfg, data)
    if cfg.mode == "bench" and not cfg.buffer.explorer_input.eval_tasksets:
        raise ConfigError("mode bench evaluates buffer.explorer_input.eval_tasksets; give at least one")


def _check_decoupled(cfg: RLCoreConfig) -> None:
    """A decoupled run (an RL algorithm in mode train, which reads the experience buffer, or in mode
    explore, which writes it): what its two launches cannot do."""
    eb = cfg.buffer.trainer_input.experience_buffer
    key = "buffer.trainer_input.experience_buffer"
    if eb.path and eb.storage_type == "queue":
        check_address(eb.path, f"{key}.path")
    if cfg.trainer.remote is not None:
        raise ConfigError(
            f"mode {cfg.mode} with algorithm {cfg.algorithm.algorithm_type} is half of a decoupled run, whose trainer "
            "is started by `rlcore launch` (trainer.remote is not supported there yet): drop trainer.remote"
        )


def _check_asynchronous(cfg: RLCoreConfig) -> None:
    """synchronizer.asynchronous: mode both's explorer in a thread, joined to the trainer by an
    in-memory buffer and published weights."""
    sc, eb = cfg.synchronizer, cfg.buffer.trainer_input.experience_buffer
    if cfg.mode != "both":
        raise ConfigError(
            f"synchronizer.asynchronous runs mode both's explorer beside its trainer; got mode {cfg.mode} "
            "(a decoupled run is two launches: mode explore and mode train)"
        )
    problems = [
        (sc.rollout_ahead != 0, "synchronizer.rollout_ahead (the explorer runs ahead by itself): set it 0"),
        (cfg.trainer.remote is not None, "trainer.remote: drop it"),
        (eb.storage_type != "queue" or bool(eb.path),
         "buffer.trainer_input.experience_buffer other than the in-memory queue (a persistent buffer is for "
         "mode explore + mode train launches): storage_type queue, no path"),
    ]  # fmt: skip
    _refuse(problems, "synchronizer.asynchronous")


def _refuse(problems: list[tuple[bool, str]], setting: str) -> None:
    """The first of `problems` (bad?, what and its fix) that holds, as `setting` does not go with it."""
    for bad, what in problems:
        if bad:
            raise ConfigError(f"{setting} does not go with {what}")


def _check_long_tails(cfg: RLCoreConfig) -> None:
    """explorer.over_rollout and explorer.dynamic_timeout: an explorer that writes to the experience
    buffer (mode explore, asynchronous both), whose steps need not be a whole batch each; mode train
    shares a decoupled run's config with mode explore and ignores them."""
    ex = cfg.explorer
    if not (ex.over_rollout.ratio > 0 or ex.dynamic_timeout.enable):
        return
    what = (
        "explorer.over_rollout.ratio" if cfg.explorer.over_rollout.ratio > 0 else "explorer.dynamic_timeout"
    )
    if cfg.mode not in ("explore", "train") and not (cfg.mode == "both" and cfg.synchronizer.asynchronous):
        raise ConfigError(
            f"{what} is for an explorer that feeds the experience buffer, whose trainer takes whole batches "
            f"from it: mode explore (a mode-train launch of the same config ignores it), or mode both with "
            f"synchronizer.asynchronous: true; got mode {cfg.mode}"
            + (" (lock-step)" if cfg.mode == "both" else "")
        )


def _check_partial_rollout(cfg: RLCoreConfig) -> None:
    """explorer.partial_rollout: rollout workers whose weights change while they generate (an
    engine that cannot interrupt its calls is refused by the worker: rollout serve)."""
    key = "explorer.partial_rollout"
    if cfg.mode not in ("explore", "train") and not (cfg.mode == "both" and cfg.synchronizer.asynchronous):
        raise ConfigError(
            f"{key} continues generation across weight updates that reach rollout workers while they run "
            f"tasks: mode explore (a mode-train launch of the same config ignores it), or mode both with "
            f"synchronizer.asynchronous: true; got mode {cfg.mode}"
            + (" (lock-step)" if cfg.mode == "both" else "")
        )


def _check_explored_pairs(cfg: RLCoreConfig, data: str) -> None:
    """algorithm.dpo.pairs buffer: DPO, in a decoupled run, on groups of two responses or more."""
    key = "algorithm.dpo.pairs"
    if data != "pairs":
        raise ConfigError(
            f"{key}: buffer is where DPO's pairs come from; algorithm.algorithm_type {cfg.algorithm.algorithm_type} "
            "trains on no pairs: set algorithm_type dpo, or algorithm.dpo.pairs taskset"
        )
    if cfg.mode not in ("train", "explore"):
        raise ConfigError(
            f"{key}: buffer pairs come from a decoupled run's explorer: mode explore for it and mode train for "
            f"the trainer (one config); got mode {cfg.mode}"
        )
    if cfg.algorithm.repeat_times < 2:
        raise ConfigError(
            f"{key}: buffer pairs are the best and the worst of each task's responses: "
            f"algorithm.repeat_times must be 2 or more; got {cfg.algorithm.repeat_times}"
        )


def _check_buffer_sampling(cfg: RLCoreConfig, data: str) -> None:
    """The replay buffer and algorithm.sample_strategy: what a trainer on the experience buffer
    (RL in mode train, asynchronous both) does with the groups it takes. Mode explore shares a
    decoupled run's config and ignores them."""
    on_buffer = data == "rollouts" and (cfg.mode in ("train", "explore") or cfg.synchronizer.asynchronous)
    eb = cfg.buffer.trainer_input.experience_buffer
    key = "buffer.trainer_input.experience_buffer.replay_buffer"
    if eb.replay_buffer.enable:
        if not on_buffer:
            raise ConfigError(
                f"{key} replays groups of the experience buffer to a trainer that reads it: an RL algorithm in mode "
                f"train, or mode both with synchronizer.asynchronous: true; got mode {cfg.mode} with {cfg.algorithm.algorithm_type}"
            )
        if eb.storage_type != "queue":
            raise ConfigError(
                f"{key} keeps its pool in memory: it needs buffer.trainer_input.experience_buffer.storage_type queue; "
                f"got {eb.storage_type}"
            )
    if cfg.algorithm.sample_strategy == "staleness_control":
        if not on_buffer:
            raise ConfigError(
                "algorithm.sample_strategy staleness_control is for a trainer on the experience buffer (mode train, "
                "asynchronous both); a lock-step run drops experiences older than synchronizer.max_staleness already"
            )
        if max_staleness(cfg) is None:
            raise ConfigError(
                "algorithm.sample_strategy staleness_control leaves out experiences older than "
                "synchronizer.max_staleness: set it (e.g. synchronizer.max_staleness=1)"
            )


def _check_rollout_and_sync(cfg: RLCoreConfig) -> None:
    rm = cfg.explorer.rollout_model
    for i, address in enumerate(rm.endpoints):
        check_address(address, f"explorer.rollout_model.endpoints[{i}]")
    if rm.engine_type == "tinker" and tinker_url(cfg.trainer.remote) is None:
        raise ConfigError(
            "explorer.rollout_model.engine_type tinker samples from the Tinker service that trains the run: set "
            "trainer.remote=tinker://host:port (or another engine_type)"
        )
    if tinker_url(cfg.trainer.remote) is not None:
        _check_tinker_run(cfg)
    else:
        _check_tinker_section_unread(cfg)
    if cfg.trainer.remote is not None and tinker_url(cfg.trainer.remote) is None:
        check_address(cfg.trainer.remote, "trainer.remote")
        if cfg.continue_from_checkpoint or cfg.mode not in ("both", "train"):
            raise ConfigError(
                "trainer.remote runs modes both and train from the start (no continue_from_checkpoint yet); "
                f"got mode {cfg.mode}"
                + (" with continue_from_checkpoint" if cfg.continue_from_checkpoint else "")
            )
    method = cfg.synchronizer.sync_method
    if cfg.mode == "colocate":
        ranks = cfg.cluster.ranks
        if rm.engine_num not in (1, ranks) or rm.endpoints:
            allowed = "1 (in rank 0)" + (f" or {ranks} (one in each trainer rank)" if ranks > 1 else "")
            raise ConfigError(
                "mode colocate runs its engines inside the trainer: explorer.rollout_model.engine_num must be "
                f"{allowed} and endpoints empty; got engine_num {rm.engine_num}"
                + (f" and {len(rm.endpoints)} endpoint(s)" if rm.endpoints else "")
                + ": use mode both for separate rollout workers"
            )
        if method == "nccl":
            raise ConfigError(
                "synchronizer.sync_method nccl sends weights to separate rollout workers (mode both); "
                "mode colocate uses memory (or auto)"
            )
    if cfg.mode == "both" and method == "memory":
        raise ConfigError(
            "synchronizer.sync_method memory needs the engine in the trainer's process (mode colocate); "
            "mode both uses nccl (or auto)"
        )
    _check_engine_and_sync(cfg)


def _check_tinker_section_unread(cfg: RLCoreConfig) -> None:
    """trainer.tinker is read only with a Tinker service: a value set there without one would
    change nothing, so it is refused (as trainer.megatron under another strategy is)."""
    default = TinkerConfig()
    for f in dataclasses.fields(TinkerConfig):
        if getattr(cfg.trainer.tinker, f.name) != getattr(default, f.name):
            remote = f"'{cfg.trainer.remote}'" if cfg.trainer.remote else "not set"
            raise ConfigError(
                f"trainer.tinker.{f.name}: trainer.tinker is read only when trainer.remote names a Tinker "
                f"service, and trainer.remote is {remote} (it would change nothing): set "
                "trainer.remote=tinker://host:port, or drop trainer.tinker"
            )


def _check_tinker_run(cfg: RLCoreConfig) -> None:
    """trainer.remote tinker://...: the loop here, training and sampling on the Tinker service."""
    rm, lora = cfg.explorer.rollout_model, cfg.model.lora_configs
    problems = [
        (cfg.mode not in ("both", "train"), f"mode {cfg.mode}: use mode both (RL) or train (SFT)"),
        (rm.engine_type != "tinker",
         f"explorer.rollout_model.engine_type {rm.engine_type} (the service keeps the weights it trains; its "
         "samplers serve them): set explorer.rollout_model.engine_type=tinker"),
        (cfg.synchronizer.sync_method not in ("auto", "checkpoint"),
         f"synchronizer.sync_method {cfg.synchronizer.sync_method} (the engines load the service's sampler paths): "
         "set it auto"),
        (len(lora) > 1, "more than one model.lora_configs entry (a Tinker model has one adapter): keep one"),
        (bool(lora) and lora[0].target_modules != "all-linear",
         "model.lora_configs[0].target_modules other than all-linear (Tinker adapts attention and MLP layers, "
         "not named modules): set all-linear"),
        (bool(lora) and lora[0].path is not None,
         "model.lora_configs[0].path (Tinker starts an adapter afresh, or from a tinker:// checkpoint): drop it"),
    ]  # fmt: skip
    _refuse(problems, f"trainer.remote {cfg.trainer.remote} (a Tinker service)")


TINKER_LOSSES = {
    "ppo_clip": "ppo",
    "importance_sampling": "importance_sampling",
    "cispo": "cispo",
    "gspo": "gspo",
}
"""algorithm.policy_loss_fn -> the Tinker loss that computes it (summed, with rlcore's aggregation
weights folded into the advantages)."""


PASS_FIXES = {
    "reference": "the reference model's log-probs, for the KL loss, the KL in the reward or an advantage "
                 "that reads them: set algorithm.kl_loss_coef=0 and use_kl_in_reward false",
    "old_logprobs": "recomputed log-probs: set algorithm.do_old_log_prob_compute false",
    "correction": "the rollout correction's weights: set algorithm.rollout_correction.kind none",
    "routing_replay": "the routers' choices replayed or recorded: set algorithm.router_replay none",
    "teacher": "a teacher's log-probs, on-policy distillation: set algorithm.distill_coef 0, or train with "
               "rlcore's trainer",
}  # fmt: skip
"""What each of a step's passes (plan.Passes.names) computes and how a config goes without it; an
algorithm's own pass (Algorithm.passes: critic, experts) goes with its algorithm."""


def pass_refusal(setting: str, name: str, algorithm_type: str) -> str:
    """The one line that refuses step pass `name` to a trainer (`setting`: what names it)."""
    fix = PASS_FIXES.get(name, f"algorithm_type {algorithm_type}'s own, beside the policy: train it with rlcore's trainer")
    return f"{setting} runs no {name} pass ({fix})"


def _check_trainer_passes(cfg: RLCoreConfig, trainer: TrainerKind, setting: str) -> None:
    """One rule for every trainer: the step's passes it does not run are refused, the first named."""
    refused = passes_refused(trainer, passes_of(cfg.algorithm))
    if refused:
        raise ConfigError(pass_refusal(setting, refused[0], cfg.algorithm.algorithm_type))


def _check_tinker_algorithm(cfg: RLCoreConfig, data: str) -> None:
    """What a Tinker service trains: SFT (cross_entropy) and policy gradients with Tinker's losses,
    with the step passes it runs (plan.TRAINER_PASSES)."""
    algo = cfg.algorithm
    setting = f"trainer.remote {cfg.trainer.remote} (a Tinker service)"
    if data == "pairs":
        why = "trains a reward model" if algo.algorithm_type == "reward_model" else "needs a reference model"
        raise ConfigError(
            f"algorithm.algorithm_type {algo.algorithm_type} {why}, which a Tinker service does not hold: "
            "train it with rlcore's own trainer (drop trainer.remote)"
        )
    if cfg.trainer.router_aux_loss_coef > 0:
        raise ConfigError(
            f"trainer.router_aux_loss_coef: a Tinker service (trainer.remote {cfg.trainer.remote}) adds no "
            "load-balancing loss of rlcore's: set it 0, or train with rlcore's own trainer"
        )
    _check_trainer_passes(cfg, "tinker", setting)
    if data != "rollouts":
        return
    ts = [cfg.buffer.explorer_input.taskset, *cfg.buffer.explorer_input.mixture]
    problems = [
        (algo.policy_loss_fn not in TINKER_LOSSES,
         f"algorithm.policy_loss_fn {algo.policy_loss_fn} (Tinker's losses serve {', '.join(TINKER_LOSSES)})"),
        (algo.clip_ratio_c is not None, "algorithm.clip_ratio_c (Tinker's ppo has no dual clip): drop it"),
        (algo.entropy_coef > 0, "algorithm.entropy_coef (Tinker's losses have no entropy term): set it 0"),
        (any((t.rollout_args.temperature or 1.0) != 1.0 for t in ts),
         "a training taskset sampled at a temperature other than 1 (Tinker's log-probs are at temperature 1, "
         "the ratio would compare different distributions): set rollout_args.temperature 1.0"),
    ]  # fmt: skip
    _refuse(problems, setting)


def _check_lora_sync(cfg: RLCoreConfig) -> None:
    """synchronizer.lora_sync adapter on a LoRA stage: engines that merge adapters (an engine of yours
    by import path is taken at its word). A stage without LoRA (a multi-stage run's SFT warm-up)
    sends its weights whole whatever it says."""
    engine = cfg.explorer.rollout_model.engine_type
    if cfg.synchronizer.lora_sync != "adapter" or not cfg.model.lora_configs:
        return
    if ":" not in engine and "." not in engine and engine not in ADAPTER_ENGINES:
        raise ConfigError(f"synchronizer.lora_sync: adapter needs engines that merge an adapter into their base "
                          f"weights (engine_type {', '.join(sorted(ADAPTER_ENGINES))}); engine_type {engine} loads "
                          "merged weights: set synchronizer.lora_sync auto or merged")  # fmt: skip


def _check_engine_and_sync(cfg: RLCoreConfig) -> None:
    rm, sc = cfg.explorer.rollout_model, cfg.synchronizer
    if rm.engine_type in ("hf", "tinker"):  # the registered engines without them (an engine of yours by
        # import path takes what its constructor declares: rollout/engines/spec.py, checked as it is built)
        for key, bad in (
            ("tensor_parallel_size", rm.tensor_parallel_size != 1),
            ("gpu_memory_utilization", rm.gpu_memory_utilization != 0.9),
            ("enable_sleep_mode", rm.enable_sleep_mode),
        ):
            if bad:
                raise ConfigError(
                    f"explorer.rollout_model.{key} applies to engine_type vllm only; got engine_type "
                    f"{rm.engine_type}: set explorer.rollout_model.engine_type=vllm or drop it"
                )
    if cfg.mode == "colocate" and rm.engine_type == "vllm":
        # vLLM in process builds its parallel groups over the trainer's default process group (every
        # rank must build them together) and destroys that group when it shuts down.
        ranks = cfg.cluster.ranks
        if ranks > 1 and rm.engine_num != ranks:
            raise ConfigError(
                f"mode colocate with engine_type vllm and {ranks} trainer ranks runs one vLLM engine in every "
                f"rank: set explorer.rollout_model.engine_num={ranks} (got {rm.engine_num})"
            )
    # an engine in the trainer's process: colocate, or train (evaluation; in a multi-stage launch
    # the engine a colocate stage built sleeps through it, which needs the same settings)
    if rm.enable_sleep_mode and (cfg.mode not in ("colocate", "train") or cfg.cluster.device == "cpu"):
        raise ConfigError(
            "explorer.rollout_model.enable_sleep_mode shares one GPU between trainer and engine: it needs "
            f"mode colocate (or train) and cluster.device=cuda; got mode {cfg.mode}, "
            f"cluster.device={cfg.cluster.device}"
        )
    _check_lora_sync(cfg)
    if sc.sync_method == "checkpoint" and cfg.mode != "both":
        raise ConfigError(
            "synchronizer.sync_method checkpoint has separate rollout workers load an HF folder (mode both); "
            f"got mode {cfg.mode}"
        )
    if sc.checksums and (cfg.mode != "both" or sc.sync_method not in ("auto", "nccl")):
        raise ConfigError(
            "synchronizer.checksums guard weights sent over a process group (mode both, sync_method "
            f"nccl or auto); got mode {cfg.mode}, sync_method {sc.sync_method}"
        )
    if sc.sync_style == "trainer_driven" and sc.sync_interval != 1:
        raise ConfigError(
            f"synchronizer.sync_style trainer_driven syncs after every step; sync_interval {sc.sync_interval} "
            "applies to sync_style fixed only: drop it or use sync_style fixed"
        )
    if sc.rollout_ahead:
        _check_rollout_ahead(cfg)
    elif (
        sc.max_staleness is not None and sc.sync_style == "fixed" and sc.max_staleness < sc.sync_interval - 1
    ):
        raise ConfigError(
            f"synchronizer.max_staleness {sc.max_staleness} would drop every experience generated between "
            f"syncs: sync_interval {sc.sync_interval} makes them up to {sc.sync_interval - 1} versions old; "
            f"raise max_staleness to >= {sc.sync_interval - 1} or lower sync_interval"
        )


def _check_rollout_ahead(cfg: RLCoreConfig) -> None:
    sc = cfg.synchronizer
    if cfg.mode != "both":
        raise ConfigError(
            f"synchronizer.rollout_ahead overlaps rollout workers' generation with training (mode both); got "
            f"mode {cfg.mode}: an engine in the trainer's process would compete with it for the same cores"
        )
    if sc.sync_style == "explorer_driven":
        raise ConfigError(
            "synchronizer.rollout_ahead starts the next rollout before this step's sync, which sync_style "
            "explorer_driven decides just before a rollout: use sync_style fixed or trainer_driven"
        )
    interval = sc.sync_interval if sc.sync_style == "fixed" else 1
    if sc.max_staleness is not None and sc.max_staleness < interval:
        raise ConfigError(
            f"synchronizer.max_staleness {sc.max_staleness} would drop experiences generated ahead: with "
            f"rollout_ahead 1 and a sync every {interval} step(s) they are up to {interval} version(s) old; "
            f"raise max_staleness to >= {interval} or set rollout_ahead=0"
        )


SHARED_ENGINE_KEYS = (
    "model.dtype",
    "model.max_model_len",
    "explorer.rollout_model.max_batch_size",
    "explorer.rollout_model.gpu_memory_utilization",
    "explorer.rollout_model.enforce_eager",
    "explorer.rollout_model.enable_sleep_mode",
)
"""Settings of the in-process vLLM engine that every stage running one shares."""


def check_stages(stages: list[RLCoreConfig]) -> None:
    """Checks across stages. A run on a Tinker service runs every stage there. The stages that run
    vLLM in the trainer's process (mode colocate, and evaluation in modes train and bench) share one
    engine, built once per launch: vLLM cannot be torn down while the trainer runs
    (rollout/engines/in_process.py). They must ask for the same one."""
    tinker = [i for i, cfg in enumerate(stages) if tinker_url(cfg.trainer.remote) is not None]
    for i, cfg in enumerate(stages):
        if tinker and (cfg.trainer.remote, cfg.trainer.tinker) != (
            stages[0].trainer.remote,
            stages[0].trainer.tinker,
        ):
            raise ConfigError(
                f"stages[{i}].trainer: a run trains on one Tinker service (stage {tinker[0]} names "
                f"{stages[tinker[0]].trainer.remote}): give every stage the same trainer.remote and trainer.tinker"
            )
    first: tuple[int, RLCoreConfig] | None = None
    for i, cfg in enumerate(stages):
        if not _runs_vllm_in_process(cfg):
            continue
        if first is None:
            first = (i, cfg)
            continue
        for key in SHARED_ENGINE_KEYS:
            old, new = _lookup(first[1], key), _lookup(cfg, key)
            if old != new:
                raise ConfigError(
                    f"stages[{i}].{key}: {new!r} differs from stage {first[0]}'s {old!r}; the stages that run "
                    "vLLM in the trainer's process share one engine, built once per launch: give them the same "
                    f"{key} (or run this stage as a separate launch)"
                )


def _runs_vllm_in_process(cfg: RLCoreConfig) -> bool:
    if cfg.explorer.rollout_model.engine_type != "vllm" or cfg.trainer.remote is not None:
        return False
    from ..algorithms import trains_reward_model

    # a reward model evaluates its held-out pairs by the trainer's scores, on no engine
    evaluates = bool(cfg.buffer.explorer_input.eval_tasksets) and not trains_reward_model(cfg.algorithm)
    return cfg.mode in ("colocate", "bench") or (cfg.mode == "train" and evaluates)


def _lookup(cfg: object, dotted: str) -> object:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
