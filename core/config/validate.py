"""Value checks beyond types: allowed choices, numeric ranges, files that must exist, and the few
rules that relate fields to each other. Messages are one line: `<full.key.path>: <what is allowed>`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from ..reasoning import reasoning_tags_problem
from ..registry import import_path
from .errors import ConfigError
from .generator_checks import check_generator_args
from .host_checks import check_hosts
from .model_checks import check_model
from .package_checks import check_packages
from .plan import filled
from .schema import MONITOR_TYPES, RLCoreConfig, TasksetConfig
from .selection_checks import check_task_selection
from .shape_checks import check_engines, check_shape


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
        by_path = meta.get("by_path", False)
        if value not in allowed and not (by_path and ":" in str(value)):
            also = " (or an import path 'pkg.mod:name')" if by_path else ""
            raise ConfigError(f"{path} must be one of {', '.join(allowed)}{also}; got '{value}'")
    bounds = {
        "ge": (">=", lambda a, b: a >= b),
        "gt": (">", lambda a, b: a > b),
        "le": ("<=", lambda a, b: a <= b),
        "lt": ("<", lambda a, b: a < b),
    }
    for name, (sym, ok) in bounds.items():
        if name in meta and not ok(value, meta[name]):
            raise ConfigError(f"{path} must be {sym} {meta[name]}; got {value}")


_SWITCHES = {"True": "on", "False": "off"}
"""YAML 1.1 reads `on` and `off` as booleans (`cluster.fork_server=off` arrives as 'False'): a choice
between "on" and "off" takes them back."""


def _walk(obj: Any, prefix: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        choices = f.metadata.get("choices")
        if isinstance(choices, tuple) and {"on", "off"} <= set(choices) and str(value) in _SWITCHES:
            value = _SWITCHES[str(value)]
            setattr(obj, f.name, value)
        _check_field(path, value, dict(f.metadata))
        if dataclasses.is_dataclass(value):
            _walk(value, path + ".")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    _walk(item, f"{path}[{i}].")


PROMPT_TYPES = ("plaintext", "messages")


def _is_hub_id(path: str) -> bool:
    from ..data.dataset_files import is_hub_id

    return is_hub_id(path)


def _readable_now(ts: TasksetConfig) -> bool:
    from ..data.dataset_files import readable_now

    return readable_now(ts)


SELF_SCORED = ("verifiers",)
"""Workflows whose environment scores the rollouts itself (the taskset's reward_fn is not used)."""


def _check_taskset(
    ts: TasksetConfig, path: str, check_paths: bool, trains_on: str = "rollouts", rewarded: bool = True,
    chat: bool = False, evaluated: bool = False, numbers: tuple[tuple[str, str], ...] = (),
) -> None:  # fmt: skip
    """`trains_on`: what its rows give (Algorithm.data); `rewarded`: whether rewards score them;
    `chat`: model.apply_chat_template; `evaluated`: an eval taskset; `numbers`: (column, the config
    key naming it) of the columns that hold a number in every row (number_columns)."""
    why = reasoning_tags_problem(ts.format.reasoning_tags)
    if why is not None:
        raise ConfigError(f"{path}.format.reasoning_tags: {why}")
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
    if ts.repeat_times != 1 and not evaluated:
        raise ConfigError(
            f"{path}.repeat_times: {ts.repeat_times} samples per task are for eval_tasksets; a training taskset "
            "samples algorithm.repeat_times per task (leave repeat_times 1 here)"
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
        check_generator_args(ts.generator, ts.generator_args, path, check_imports=check_paths)
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
                ts, path, needs_answer=rewarded and ts.default_workflow_type not in SELF_SCORED
                and any(n in correctness for n in ts.reward_fn),
                needs_response=trains_on == "responses", needs_pair=trains_on == "pairs", numbers=numbers,
            )  # fmt: skip
        except TasksetError as e:
            raise ConfigError(str(e)) from None


def _check_mixture(cfg: RLCoreConfig, check_paths: bool, data: str, chat: bool) -> None:
    """buffer.explorer_input.mixture: each taskset valid, named apart, and given at least one task
    of every batch by its weight (each samples at its own temperature: the experiences carry it)."""
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
    weights = [ins.taskset.weight] + [ts.weight for ts in ins.mixture]
    for i, count in enumerate(mixture_counts(cfg.buffer.batch_size, weights)):
        if count == 0:
            key = "buffer.explorer_input.taskset" if i == 0 else f"buffer.explorer_input.mixture[{i - 1}]"
            raise ConfigError(
                f"{key}.weight: {weights[i]} of {sum(weights)} gives it no task of a batch of {cfg.buffer.batch_size}; "
                "raise its weight or buffer.batch_size"
            )
    for i, ts in enumerate(ins.mixture):
        _check_taskset(
            ts, f"buffer.explorer_input.mixture[{i}]", check_paths, data, rewarded=data == "rollouts", chat=chat,
            numbers=number_columns(cfg),
        )  # fmt: skip


def number_columns(cfg: RLCoreConfig) -> tuple[tuple[str, str], ...]:
    """(column, the key that names it) of the training tasksets' columns that must hold a number in
    every row: a reward model's pair margins, a curriculum's difficulty."""
    from ..algorithms import trains_reward_model

    out = []
    if trains_reward_model(cfg.algorithm) and cfg.algorithm.reward_model.margin_key is not None:
        out.append((cfg.algorithm.reward_model.margin_key, "algorithm.reward_model.margin_key"))
    curriculum = cfg.buffer.explorer_input.task_selection.curriculum
    if curriculum.order == "column" and curriculum.column is not None:
        out.append((curriculum.column, "buffer.explorer_input.task_selection.curriculum.column"))
    return tuple(out)


def validate_config(cfg: RLCoreConfig, check_paths: bool = True) -> None:
    """Raise ConfigError on the first invalid value. Only checks: `plan.filled` writes what the
    plan decides for unset values (the algorithm's preset, ...)."""
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
    if check_paths:  # what this machine must have installed
        check_packages(cfg)
    check_algorithm_plugs(cfg)  # before anything asks the algorithm what it trains on

    from ..algorithms import pairs_from_buffer, trains_on, trains_reward_model

    buf = cfg.buffer
    data = trains_on(cfg.algorithm)
    rows = "rollouts" if pairs_from_buffer(cfg.algorithm) else data  # what the taskset's rows are for
    if data == "rollouts":
        group, what = (
            buf.batch_size * cfg.algorithm.repeat_times,
            "buffer.batch_size * algorithm.repeat_times",
        )
    else:  # SFT's responses, DPO's pairs (explored ones too): a step trains batch_size of them
        group, what = buf.batch_size, "buffer.batch_size"
    if buf.train_batch_size and group % buf.train_batch_size:
        raise ConfigError(
            f"buffer.train_batch_size ({buf.train_batch_size}) must divide {what} ({group}), or be 0"
        )
    chat = cfg.model.apply_chat_template
    reward_model = trains_reward_model(cfg.algorithm)
    check_task_selection(cfg, rows)  # before the tasksets' rows are read for its column
    _check_taskset(  # rows trained as they are (SFT's, DPO's, a reward model's) are not rewarded
        buf.explorer_input.taskset, "buffer.explorer_input.taskset", check_paths, rows, rewarded=rows == "rollouts",
        chat=chat, numbers=number_columns(cfg),
    )  # fmt: skip
    if buf.expert_taskset is not None:
        if buf.expert_taskset.format.prompt_type == "messages":
            raise ConfigError(
                "buffer.expert_taskset.format.prompt_type: mix's expert rows are text (prompt and response)"
            )
        _check_taskset(
            buf.expert_taskset, "buffer.expert_taskset", check_paths, "responses", rewarded=False, chat=chat
        )
    for i, ts in enumerate(buf.explorer_input.eval_tasksets):
        _check_taskset(  # a reward model evaluates on pairs, scored by itself
            ts, f"buffer.explorer_input.eval_tasksets[{i}]", check_paths, "pairs" if reward_model else "rollouts",
            rewarded=not reward_model, chat=chat, evaluated=True,
        )  # fmt: skip
    _check_mixture(cfg, check_paths, rows, chat)

    check_hosts(cfg)
    check_engines(cfg)
    _check_control(cfg, check_paths)
    full = filled(cfg)  # as the plan fills it (a preset's dynamic_sampling, do_old_log_prob_compute, ...)
    _check_algorithm(full)
    if reward_model:
        _check_reward_model(full)
    _check_distillation(full, check_paths)
    check_shape(full, data)


def check_algorithm_plugs(cfg: RLCoreConfig) -> None:
    """The algorithm parts given by import path import and work on a small batch (plugs.py)."""
    from ..algorithms.plugs import check_plugs

    try:
        check_plugs(cfg.algorithm)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_reward_model(cfg: RLCoreConfig) -> None:
    """What a reward model's stage (algorithm_type reward_model) trains with."""
    if cfg.model.lora_configs:
        raise ConfigError(
            "model.lora_configs: a reward model trains its full weights and its head (no LoRA adapter): "
            "drop lora_configs for this stage"
        )
    if cfg.trainer.router_aux_loss_coef > 0:
        raise ConfigError(
            "trainer.router_aux_loss_coef: a reward model's step adds no load-balancing loss: set it 0 for this stage"
        )


def _check_algorithm(cfg: RLCoreConfig) -> None:
    """Refuse algorithm settings that cannot train (`cfg` as the plan fills it: plan.filled)."""
    from ..algorithms import (
        GROUP_BASELINES,
        reads_reference,
        trains_critic,
        trains_on,
        trains_on_experts,
        with_preset,
    )

    a = with_preset(cfg.algorithm)
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
    if a.router_replay == "r2" and not a.do_old_log_prob_compute:
        raise ConfigError(
            "algorithm.router_replay: r2 records the routing of the trainer's old-log-prob pass, and without "
            "recomputed old log-probs (do_old_log_prob_compute false, a decoupled run's default) there is none: "
            "set algorithm.do_old_log_prob_compute true, or router_replay r3 or none"
        )
    rc = a.rollout_correction
    if rc.kind != "none" and not a.do_old_log_prob_compute:
        raise ConfigError(
            f"algorithm.rollout_correction.kind {rc.kind} weighs tokens by pi_old / pi_engine, and without recomputed "
            "old log-probs (do_old_log_prob_compute false, a decoupled run's default) pi_old is the engine's: set "
            "algorithm.do_old_log_prob_compute true, or kind none"
        )
    if rc.kind != "none" and trains_on(a) != "rollouts":
        raise ConfigError(
            f"algorithm.rollout_correction.kind {rc.kind} corrects for the engine that sampled the rollouts, and "
            f"{a.algorithm_type} trains on the taskset's own rows: set kind none"
        )
    if a.length_penalty.kind != "none" and trains_on(a) == "rollouts" and a.repeat_times < 2:
        raise ConfigError(
            f"algorithm.length_penalty.kind {a.length_penalty.kind} compares the lengths of the responses to one "
            "task, and algorithm.repeat_times is 1: set repeat_times to 2 or more, or kind none"
        )
    ts = cfg.buffer.explorer_input.taskset
    budget = ts.rollout_args.max_tokens or cfg.model.max_response_tokens
    if a.overlong_buffer_len >= budget:
        raise ConfigError(
            f"algorithm.overlong_buffer_len is {a.overlong_buffer_len}, but responses may have only {budget} tokens "
            "(the taskset's rollout_args.max_tokens, else model.max_response_tokens): the buffer is the end part of "
            "that budget, so give fewer tokens (0 turns the punishment off)"
        )


def _check_distillation(cfg: RLCoreConfig, check_paths: bool) -> None:
    """On-policy distillation needs one teacher (a model folder or a service) and the student's
    recomputed log-probs; a teacher without distillation is a mistake (`cfg` as the plan fills it)."""
    from ..algorithms import distills, with_preset
    from ..data.taskset import training_tasksets
    from ..services import auxiliary_models

    a = with_preset(cfg.algorithm)
    path, service = cfg.model.teacher_model_path, cfg.model.teacher_service
    key = "model.teacher_service" if service else "model.teacher_model_path"
    if not distills(a):
        if a.algorithm_type == "on_policy_distill":
            raise ConfigError(
                "algorithm.algorithm_type on_policy_distill learns only from its teacher, and distill_coef 0 turns "
                "the teacher off: set algorithm.distill_coef > 0 (unset: 1)"
            )
        if path or service:
            raise ConfigError(
                f"{key} is set, but nothing distills from it: set algorithm.distill_coef > 0 "
                f"(or algorithm_type on_policy_distill), or leave {key} unset"
            )
        return
    if path and service:
        raise ConfigError(
            "model.teacher_model_path and model.teacher_service are both set: the teacher is one of them, a model "
            "folder scored in the trainer world or a service"
        )
    if not (path or service):
        raise ConfigError(
            f"algorithm.distill_coef {a.distill_coef} distills from a teacher: set model.teacher_model_path (an HF "
            "model folder with the student's tokenizer) or model.teacher_service (an auxiliary model serving one)"
        )
    if service:
        configured = [m["name"] for m in auxiliary_models(cfg)]
        if service not in configured:
            raise ConfigError(
                f"model.teacher_service: '{service}' is not a configured auxiliary model (explorer.auxiliary_models: "
                f"{', '.join(configured) or 'none'}; 'external' is model.external_model)"
            )
        for where, ts in training_tasksets(cfg):
            if ts.rollout_args.temperature != 1.0:
                raise ConfigError(
                    f"{where}.rollout_args.temperature is {ts.rollout_args.temperature}, but a teacher service "
                    "scores at temperature 1 (its raw log-probs): sample at 1.0, or use model.teacher_model_path, "
                    "which the trainer scores at the sampling temperature"
                )
    elif check_paths and path and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"model.teacher_model_path: '{path}' is not an HF model folder (no config.json)")
    if not a.do_old_log_prob_compute:
        raise ConfigError(
            "on-policy distillation compares the student's log-probs with the teacher's, and without recomputed "
            "old log-probs (do_old_log_prob_compute false) it has only the engine's: set "
            "algorithm.do_old_log_prob_compute true"
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
