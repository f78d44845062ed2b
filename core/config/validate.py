"""Value checks beyond types: allowed choices, numeric ranges, files that must exist, and the few
rules that relate fields to each other. Messages are one line: `<full.key.path>: <what is allowed>`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..registry import Registry, import_path
from ..rpc.address import is_host_port
from .schema import MONITOR_TYPES, RLCoreConfig, TasksetConfig


class ConfigError(ValueError):
    """A user-facing config problem; str(e) is one line naming the key path and the fix."""


def _choices(spec: tuple[str, ...] | str) -> tuple[str, ...]:
    if isinstance(spec, str):  # "module:REGISTRY": a lazy registry, imported without heavy deps
        registry = import_path(spec, what="registry")
        assert isinstance(registry, Registry)
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


def _check_taskset(ts: TasksetConfig, path: str, check_paths: bool) -> None:
    from ...rollout.rewards import REWARDS  # registry of names only; no heavy imports

    if not ts.reward_fn:
        raise ConfigError(f"{path}.reward_fn: give at least one reward function ({', '.join(REWARDS)})")
    for i, name in enumerate(ts.reward_fn):
        if name not in REWARDS and ":" not in name:
            raise ConfigError(
                f"{path}.reward_fn[{i}] must be one of {', '.join(REWARDS)} or an import path "
                f"'pkg.mod:fn'; got '{name}'"
            )
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
    elif check_paths and not os.path.exists(ts.path):
        raise ConfigError(
            f"{path}.path: '{ts.path}' does not exist (give a jsonl/parquet file or set a generator)"
        )


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

    model = cfg.model
    if model.max_prompt_tokens + model.max_response_tokens > model.max_model_len:
        raise ConfigError(
            f"model.max_prompt_tokens + model.max_response_tokens ({model.max_prompt_tokens} + "
            f"{model.max_response_tokens}) must be <= model.max_model_len ({model.max_model_len})"
        )
    sc = model.scratch
    if sc.enabled:
        if sc.hidden_size % sc.num_attention_heads:
            raise ConfigError(
                "model.scratch.hidden_size must be divisible by model.scratch.num_attention_heads"
            )
        if sc.num_attention_heads % sc.num_key_value_heads:
            raise ConfigError(
                "model.scratch.num_attention_heads must be divisible by model.scratch.num_key_value_heads"
            )
    elif check_paths and model.model_path != "<previous stage>" and not os.path.isdir(model.model_path):
        raise ConfigError(
            f"model.model_path: '{model.model_path}' is not a folder (give an HF model folder, "
            f"or set model.scratch.enabled=true to build a tiny model there)"
        )

    buf = cfg.buffer
    group = buf.batch_size * cfg.algorithm.repeat_times
    if buf.train_batch_size and group % buf.train_batch_size:
        raise ConfigError(
            f"buffer.train_batch_size ({buf.train_batch_size}) must divide buffer.batch_size * "
            f"algorithm.repeat_times ({group}), or be 0"
        )
    _check_taskset(buf.explorer_input.taskset, "buffer.explorer_input.taskset", check_paths)
    for i, ts in enumerate(buf.explorer_input.eval_tasksets):
        _check_taskset(ts, f"buffer.explorer_input.eval_tasksets[{i}]", check_paths)

    _check_rollout_and_sync(cfg)
    _check_control(cfg, check_paths)
    algo = cfg.algorithm.algorithm_type
    if cfg.mode in ("both", "colocate") and algo == "sft":
        raise ConfigError(f"mode '{cfg.mode}' needs algorithm.algorithm_type grpo; SFT runs with mode train")
    if cfg.mode == "train" and algo != "sft":
        raise ConfigError(
            f"mode train runs algorithm.algorithm_type sft; '{algo}' needs mode both or colocate"
        )
    if cfg.mode == "bench" and not buf.explorer_input.eval_tasksets:
        raise ConfigError("mode bench evaluates buffer.explorer_input.eval_tasksets; give at least one")


def check_address(value: str, path: str) -> None:
    """`host:port` with a port in 1..65535 (IPv6 hosts in brackets: [::1]:50051)."""
    if not is_host_port(value):
        raise ConfigError(f"{path} must be host:port with a port in 1..65535; got '{value}'")


def _check_rollout_and_sync(cfg: RLCoreConfig) -> None:
    rm = cfg.explorer.rollout_model
    if rm.tensor_parallel_size != 1:
        raise ConfigError(
            "explorer.rollout_model.tensor_parallel_size must be 1 with the engines of this version "
            f"(hf); got {rm.tensor_parallel_size}"
        )
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
        if rm.engine_num != 1 or rm.endpoints:
            raise ConfigError(
                "mode colocate runs one engine inside trainer rank 0: set explorer.rollout_model.engine_num=1 "
                "and no endpoints, or use mode both for separate rollout workers"
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
