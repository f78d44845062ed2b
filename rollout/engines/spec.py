"""What builds one inference engine, resolved once from the run's config (or a worker's flags) and
handed whole to whoever builds it: a rollout worker takes it as one argument (`--engine-spec`), the
trainer's process builds its in-process engine from it. Torch-free.

An engine owns its settings: its constructor's keyword parameters are the options it takes
(`build_engine` in __init__.py hands each one what it declares and refuses a setting it would
ignore). Every engine takes COMMON; the rest of a spec's `options` are the run's engine settings:
  - `explorer.rollout_model`'s shared ones (SHARED: tensor parallelism, vLLM's memory share, eager
    decoding, sleep mode), refused by an engine without them unless at their default;
  - context an engine takes only where it has a use for it (CONTEXT: its seed, whether it runs in
    the trainer's process, the Tinker service of a tinker:// trainer), never refused;
  - `explorer.rollout_model.engine_options`, the engine's own section: each key must be one of its
    options.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

COMMON = ("device", "dtype", "max_model_len", "max_batch_size")
"""Keyword arguments every engine's constructor takes."""

SHARED = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "enforce_eager": False, "enable_sleep_mode": False}
"""explorer.rollout_model's engine settings, by name, with the value that asks nothing of an engine."""

CONTEXT = ("seed", "in_process", "service_url", "service_model", "service_key_env")
"""Settings an engine takes where it declares them and that no other engine must refuse."""


@dataclass(frozen=True)
class EngineSpec:
    engine_type: str
    """A name in ENGINES, or an import path 'pkg.mod:Class' of a RolloutEngine subclass."""
    model_path: str
    device: str
    dtype: str
    max_model_len: int | None
    max_batch_size: int
    options: dict[str, Any] = field(default_factory=dict)
    """SHARED and CONTEXT settings by name (see the module's docstring)."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    """The engine's own section (explorer.rollout_model.engine_options)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EngineSpec:
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as e:
            raise ValueError(f"--engine-spec is not an engine spec (JSON of EngineSpec's fields): {e}") from None

    def with_model(self, model_path: str) -> EngineSpec:
        return EngineSpec(**{**asdict(self), "model_path": model_path})


def engine_spec(cfg: Any, model_path: str, device: str, dtype: str, seed: int, in_process: bool = False) -> EngineSpec:
    """The spec of the engines a run's config asks for (explorer.rollout_model), on `device`;
    `in_process`: the engine in a trainer rank's process (the in_process setting), on that rank's
    device (the tensor-parallel size is the rollout workers')."""
    from ...core.config.host_checks import tinker_url

    rm = cfg.explorer.rollout_model
    options: dict[str, Any] = {name: getattr(rm, name) for name in SHARED}
    if in_process:
        options.update(in_process=True, tensor_parallel_size=SHARED["tensor_parallel_size"])
    options["seed"] = seed
    url = tinker_url(cfg.trainer.remote)
    if url is not None:  # a Tinker trainer: the service an engine may sample from
        tk = cfg.trainer.tinker
        options.update(
            service_url=url, service_model=tk.base_model or cfg.model.model_path, service_key_env=tk.api_key_env
        )
    return EngineSpec(
        rm.engine_type, model_path, device, dtype, cfg.model.max_model_len, rm.max_batch_size, options,
        dict(rm.engine_options),
    )  # fmt: skip
