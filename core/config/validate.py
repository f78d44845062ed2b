"""Value checks beyond types: allowed choices, numeric ranges, files that must exist, and the few
rules that relate fields to each other. Messages are one line: `<full.key.path>: <what is allowed>`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from ..registry import import_path
from .errors import ConfigError
from .host_checks import check_address, check_hosts
from .model_checks import check_model
from .schema import MONITOR_TYPES, RLCoreConfig, TasksetConfig


def _choices(spec: tuple[str, ...] | str) -> tuple[str, ...]:
    if isinstance(spec, str):  # "module:REGISTRY": a lazy registry, imported without heavy deps
        registry = import_path(spec, what="registry")
        assert isinstance(registry, Mapping)
        return tuple(registry)
    return spec


def _check_field(path: str, value: Any, meta: dict[str, Any]) -> None:
    if value is None:
        return
    if "choices" in meta:
        allowed = _choices(meta["choices"])
        if value not in allowed:
            raise ConfigError(f"{path} must be one of {', '.join(allowed)}; got '{value}'")
    bounds = {
        "ge": (">=", lambda a, b: a >= b),
        "gt": (">", lambda a, b: a > b),
        "le": ("<=", lambda a, b: a <= b),
        "lt": ("<", lambda a, b: a < b),
    }
    for name, (sym, ok) in bounds.items():
        if name in meta and not ok(value, meta[name]):
            raise ConfigError(f"{path} must be {sym} {meta[name]}; got {value}")


def _walk(obj: Any, prefix: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        _check_field(path, value, dict(f.metadata))
        if dataclasses.is_dataclass(value):
            _walk(value, path + ".")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    _walk(item, f"{path}[{i}].")


PROMPT_TYPES = ("plaintext", "messages")


def _is_hub_id(path: str) -> bool:
    from ..data.taskset import is_hub_id

    return is_hub_id(path)


def _readable_now(ts: TasksetConfig) -> bool:
    from ..data.taskset import readable_now

    return readable_now(ts)


def _check_taskset(
    ts: TasksetConfig, path: str, check_paths: bool, trains_on: str = "rollouts", rewarded: bool = True,
    chat: bool = False,
) -> None:  # fmt: skip
    """`trains_on`: what its rows give (AlgorithmSpec.data); `rewarded`: whether rewards score them;
    `chat`: model.apply_chat_template."""
    if ts.format.prompt_type not in PROMPT_TYPES:
        raise ConfigError(
            f"{path}.format.prompt_type must be one of {', '.join(PROMPT_TYPES)}; got '{ts.format.prompt_type}'"
        )
    if ts.format.prompt_type == "messages" and not chat:
        raise ConfigError(
            f"{path}.format.prompt_type: messages need model.apply_chat_template: true (the chat template renders them)"
        )
    if ts.format.prompt_type == "messages" and trains_on == "pairs":
        raise ConfigError(
            f"{path}.format.prompt_type: DPO reads prompts as text; messages are for SFT and rollouts"
        )
    # the reward registry, named as schema choices name theirs (names only; no heavy imports)
    REWARDS = _choices("rlcore.rollout.rewards:REWARDS")
    if not ts.reward_fn:
        raise ConfigError(f"{path}.reward_fn: give at least one reward function ({', '.join(REWARDS)})")
    for i, name in enumerate(ts.reward_fn):
        if name not in REWARDS and ":" not in name:
            raise ConfigError(
                f"{path}.reward_fn[{i}] must be one of {', '.join(REWARDS)} or an import path "
                f"'pkg.mod:fn'; got '{name}'"
            )
    WORKFLOWS = _choices("rlcore.rollout.workflows:WORKFLOWS")
    if ts.default_workflow_type not in WORKFLOWS and ":" not in ts.default_workflow_type:
        raise ConfigError(
            f"{path}.default_workflow_type must be one of {', '.join(WORKFLOWS)} or an import path "
            f"'pkg.mod:Class'; got '{ts.default_workflow_type}'"
        )
    try:
        json.dumps(ts.workflow_args, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{path}.workflow_args must hold JSON values (it travels with RunTasks): {e}"
        ) from None
    if ts.reward_weights and len(ts.reward_weights) != len(ts.reward_fn):
        raise ConfigError(
            f"{path}.reward_weights has {len(ts.reward_weights)} entries but reward_fn has "
            f"{len(ts.reward_fn)}; give one weight per reward function or none"
        )
    if ts.generator is not None:
        from ..data import GENERATORS

        if ts.generator not in GENERATORS and ":" not in ts.generator:
            raise ConfigError(
                f"{path}.generator must be one of {', '.join(GENERATORS)} or an import path; got '{ts.generator}'"
            )
    elif check_paths and not os.path.exists(ts.path) and not _is_hub_id(ts.path):
        raise ConfigError(
            f"{path}.path: '{ts.path}' does not exist (give a jsonl/parquet/csv file, a save_to_disk folder, a Hub "
            "dataset id 'org/name', or set a generator)"
        )
    if check_paths and _readable_now(ts):
        # a generator writes a missing one at launch
        from ..data.taskset_check import TasksetError, check_taskset

        correctness = import_path("rlcore.rollout.rewards.compose:CORRECTNESS_REWARDS", what="registry")
        try:
            check_taskset(
                ts, path, needs_answer=rewarded and any(n in correctness for n in ts.reward_fn),
                needs_response=trains_on == "responses", needs_pair=trains_on == "pairs",
            )  # fmt: skip
        except TasksetError as e:
            raise ConfigError(str(e)) from None


def _check_mixture(cfg: RLCoreConfig, check_paths: bool, data: str, chat: bool) -> None:
    """buffer.explorer_input.mixture: each taskset valid, named apart, sampled at the taskset's
    temperature, and given at least one task of every batch by its weight."""
    from ..data.taskset import mixture_counts

    ins = cfg.buffer.explorer_input
    if not ins.mixture:
        return
    names = [ins.taskset.name]
    for i, ts in enumerate(ins.mixture):
        key = f"buffer.explorer_input.mixture[{i}]"
        if ts.name in names:
            raise ConfigError(
                f"{key}.name: '{ts.name}' names another training taskset too; give each its own name"
            )
        names.append(ts.name)
        if ts.rollout_args.temperature != ins.taskset.rollout_args.temperature:
            raise ConfigError(
                f"{key}.rollout_args.temperature: {ts.rollout_args.temperature} differs from the taskset's "
                f"{ins.taskset.rollout_args.temperature}; the trainer scores every rollout at one temperature"
            )
    weights = [ins.taskset.weight] + [ts.weight for ts in ins.mixture]
    for i, count in enumerate(mixture_counts(cfg.buffer.batch_size, weights)):
        if count == 0:
            key = "buffer.explorer_input.taskset" if i == 0 else f"buffer.explorer_input.mixture[{i - 1}]"
            raise ConfigError(
                f"{key}.weight: {weights[i]} of {sum(weights)} gives it no task of a batch of {cfg.buffer.batch_size}; "
                "raise its weight or buffer.batch_size"
            )
    for i, ts in enumerate(ins.mixture):
        _check_taskset(ts, f"buffer.explorer_input.mixture[{i}]", check_paths, data, chat=chat)


def validate_config(cfg: RLCoreConfig, check_paths: bool = True) -> None:
    """Raise ConfigError on the first invalid value."""
    _walk(cfg, "")
    for i, m in enumerate(cfg.monitor.monitor_type):
        if m not in MONITOR_TYPES:
            raise ConfigError(
                f"monitor.monitor_type[{i}] must be one of {', '.join(MONITOR_TYPES)}; got '{m}'"
            )

    opt = cfg.algorithm.optimizer
    if len(opt.betas) != 2 or not all(0.0 <= b < 1.0 for b in opt.betas):
        raise ConfigError(f"algorithm.optimizer.betas must be two numbers in [0, 1); got {list(opt.betas)}")

    check_model(cfg, check_paths)

    buf = cfg.buffer
    group = buf.batch_size * cfg.algorithm.repeat_times
    if buf.train_batch_size and group % buf.train_batch_size:
        raise ConfigError(
            f"buffer.train_batch_size ({buf.train_batch_size}) must divide buffer.batch_size * "
            f"algorithm.repeat_times ({group}), or be 0"
        )
    from ..algorithms import trains_on

    data = trains_on(cfg.algorithm)
    chat = cfg.model.apply_chat_template
    _check_taskset(buf.explorer_input.taskset, "buffer.explorer_input.taskset", check_paths, data, chat=chat)
    if buf.expert_taskset is not None:
        if buf.expert_taskset.format.prompt_type == "messages":
            raise ConfigError(
                "buffer.expert_taskset.format.prompt_type: mix's expert rows are text (prompt and response)"
            )
        _check_taskset(
            buf.expert_taskset, "buffer.expert_taskset", check_paths, "responses", rewarded=False, chat=chat
        )
    for i, ts in enumerate(buf.explorer_input.eval_tasksets):
        _check_taskset(ts, f"buffer.explorer_input.eval_tasksets[{i}]", check_paths, chat=chat)
    _check_mixture(cfg, check_paths, data, chat)

    check_hosts(cfg)
    _check_rollout_and_sync(cfg)
    _check_control(cfg, check_paths)
    algo = cfg.algorithm.algorithm_type
    _check_algorithm(cfg)
    if cfg.mode in ("both", "colocate") and data != "rollouts":
        raise ConfigError(
            f"mode '{cfg.mode}' explores, and algorithm.algorithm_type {algo} trains on the taskset's own "
            f"{data} instead: set mode train (or an RL algorithm_type: grpo, ppo, rloo, ...)"
        )
    if cfg.mode == "explore" and data != "rollouts":
        raise ConfigError(
            f"mode explore writes rollouts for an RL algorithm; algorithm.algorithm_type {algo} trains on the "
            f"taskset's own {data}: set an RL algorithm_type (grpo, ppo, rloo, ...) or mode train"
        )
    if cfg.mode in ("train", "explore") and data == "rollouts":
        _check_decoupled(cfg)
    if cfg.synchronizer.asynchronous:
        _check_asynchronous(cfg)
    _check_long_tails(cfg)
    _check_buffer_sampling(cfg, data)
    if cfg.mode == "bench" and not buf.explorer_input.eval_tasksets:
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
    if cfg.mode == "explore":
        if cfg.algorithm.dynamic_sampling:
            raise ConfigError(
                "algorithm.dynamic_sampling refills a lock-step batch; a decoupled run (mode explore) does not run "
                "it: set it false, or use mode both"
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
        (bool(cfg.algorithm.dynamic_sampling), "algorithm.dynamic_sampling (a lock-step refill): set it false"),
        (cfg.trainer.remote is not None, "trainer.remote: drop it"),
        (eb.storage_type != "queue" or bool(eb.path),
         "buffer.trainer_input.experience_buffer other than the in-memory queue (a persistent buffer is for "
         "mode explore + mode train launches): storage_type queue, no path"),
    ]  # fmt: skip
    for bad, what in problems:
        if bad:
            raise ConfigError(f"synchronizer.asynchronous does not go with {what}")
    if sc.max_staleness is None:
        sc.max_staleness = 1


def schedules_tasks(cfg: RLCoreConfig) -> bool:
    """Whether the explorer runs its tasks one by one (rollout/scheduler.py): over_rollout or
    dynamic_timeout on."""
    ex = cfg.explorer
    return ex.over_rollout.ratio > 0 or ex.dynamic_timeout.enable


def _check_long_tails(cfg: RLCoreConfig) -> None:
    """explorer.over_rollout and explorer.dynamic_timeout: an explorer that writes to the experience
    buffer (mode explore, asynchronous both), whose steps need not be a whole batch each; mode train
    shares a decoupled run's config with mode explore and ignores them."""
    if not schedules_tasks(cfg):
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
        if cfg.synchronizer.max_staleness is None:
            raise ConfigError(
                "algorithm.sample_strategy staleness_control leaves out experiences older than "
                "synchronizer.max_staleness: set it (e.g. synchronizer.max_staleness=1)"
            )


def _check_algorithm(cfg: RLCoreConfig) -> None:
    """Fill the algorithm's preset into the unset knobs; refuse combinations that cannot train."""
    from ..algorithms import (
        GROUP_BASELINES,
        reads_reference,
        trains_critic,
        trains_on,
        trains_on_experts,
        with_preset,
    )

    cfg.algorithm = with_preset(cfg.algorithm)
    a = cfg.algorithm
    if a.do_old_log_prob_compute is None:  # a decoupled run's experiences are off-policy by design
        decoupled = cfg.mode in ("train", "explore") or cfg.synchronizer.asynchronous
        a.do_old_log_prob_compute = not (decoupled and trains_on(a) == "rollouts")
    if a.repeat_times < 2 and a.advantage_fn in GROUP_BASELINES:
        raise ConfigError(
            f"algorithm.repeat_times is 1, but {a.algorithm_type} (advantage_fn {a.advantage_fn}) compares each "
            "response with the other responses to its task: set algorithm.repeat_times to 2 or more"
        )
    if a.dynamic_sampling and a.repeat_times < 2:
        raise ConfigError(
            "algorithm.dynamic_sampling drops the groups whose responses all got the same reward, and with "
            "algorithm.repeat_times 1 that is every group: set repeat_times to 2 or more, or dynamic_sampling false"
        )
    if trains_on_experts(a) and cfg.buffer.expert_taskset is None:
        raise ConfigError(
            f"algorithm.algorithm_type {a.algorithm_type} also trains on expert demonstrations: set "
            "buffer.expert_taskset (a taskset with prompt and response columns, as SFT reads them)"
        )
    if a.advantage_fn == "gae" and not trains_critic(a):
        raise ConfigError(
            f"algorithm.advantage_fn: gae needs a critic's values, and {a.algorithm_type} trains none: "
            "set algorithm_type ppo (which trains one, see the critic section) or another advantage_fn"
        )
    if a.sync_ref_model and not reads_reference(a):
        raise ConfigError(
            f"algorithm.sync_ref_model moves the reference model, but {a.algorithm_type} as configured reads none: "
            "set algorithm.kl_loss_coef > 0 (with a kl_loss_fn) or use_kl_in_reward true, or sync_ref_model false"
        )
    ts = cfg.buffer.explorer_input.taskset
    budget = ts.rollout_args.max_tokens or cfg.model.max_response_tokens
    if a.overlong_buffer_len >= budget:
        raise ConfigError(
            f"algorithm.overlong_buffer_len is {a.overlong_buffer_len}, but responses may have only {budget} tokens "
            "(the taskset's rollout_args.max_tokens, else model.max_response_tokens): the buffer is the end part of "
            "that budget, so give fewer tokens (0 turns the punishment off)"
        )


def _check_rollout_and_sync(cfg: RLCoreConfig) -> None:
    rm = cfg.explorer.rollout_model
    for i, address in enumerate(rm.endpoints):
        check_address(address, f"explorer.rollout_model.endpoints[{i}]")
    if cfg.trainer.remote is not None:
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


def _check_engine_and_sync(cfg: RLCoreConfig) -> None:
    rm, sc = cfg.explorer.rollout_model, cfg.synchronizer
    if rm.engine_type != "vllm":
        for key, bad in (
            ("tensor_parallel_size", rm.tensor_parallel_size != 1),
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


def _check_control(cfg: RLCoreConfig, check_paths: bool) -> None:
    control = cfg.control
    if not control.token_env or not control.token_env.replace("_", "").isalnum():
        raise ConfigError(
            f"control.token_env must name an environment variable (letters, digits, _); got '{control.token_env}'"
        )
    tls = control.tls
    if not tls.enabled:
        return
    needed = ["cert_file", "key_file"] + (["ca_file"] if tls.require_client_cert else [])
    for key in needed:
        if not getattr(tls, key):
            raise ConfigError(
                f"control.tls.{key} is required when control.tls.enabled"
                + (" and require_client_cert" if key == "ca_file" else "")
                + " (a PEM file)"
            )
    if check_paths:
        for key in ("cert_file", "key_file", "ca_file"):
            path = getattr(tls, key)
            if path and not os.path.isfile(path):
                raise ConfigError(f"control.tls.{key}: '{path}' is not a file (give a PEM file)")


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
    """Checks across stages. The stages that run vLLM in the trainer's process (mode colocate, and
    evaluation in modes train and bench) share one engine, built once per launch: vLLM cannot be
    torn down while the trainer runs (rollout/engines/in_process.py). They must ask for the same one."""
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
    evaluates = bool(cfg.buffer.explorer_input.eval_tasksets)
    return cfg.mode in ("colocate", "bench") or (cfg.mode == "train" and evaluates)


def _lookup(cfg: object, dotted: str) -> object:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
