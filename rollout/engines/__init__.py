"""Inference engines behind the RolloutEngine interface (engines/base.py)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from ...core.registry import Registry
from .spec import COMMON, CONTEXT, SHARED, EngineSpec

if TYPE_CHECKING:
    from .base import RolloutEngine

ENGINES = Registry(
    "explorer.rollout_model.engine_type",
    {
        "hf": "rlcore.rollout.engines.hf:HFEngine",
        "vllm": "rlcore.rollout.engines.vllm:VLLMEngine",
        "tinker": "rlcore.rollout.engines.tinker:TinkerEngine",
    },
)


def engine_class(engine_type: str) -> type[RolloutEngine]:
    """The engine class `engine_type` names: an ENGINES entry or a RolloutEngine subclass by import
    path 'pkg.mod:Class' (ValueError saying what is allowed)."""
    from .base import RolloutEngine

    return ENGINES.resolve_class(engine_type, RolloutEngine, ENGINES.key_path)


def build_engine(spec: EngineSpec) -> RolloutEngine:
    """The engine `spec` describes, given the options its constructor declares (spec.py says which
    settings reach which engine). ValueError, in one line, for a setting the engine does not take."""
    cls: Any = engine_class(spec.engine_type)  # the interface leaves construction to each engine
    options = engine_options(cls, spec.options, spec.engine_options)
    common = {name: getattr(spec, name) for name in COMMON}
    engine: RolloutEngine = cls(spec.model_path, **common, **options)
    return engine


def engine_options(cls: type, offered: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `cls`'s constructor among `offered` (SHARED and CONTEXT settings)
    and `own` (its engine_options section); ValueError for one it lacks that would change something."""
    declared = {
        name: p for name, p in inspect.signature(cls).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in COMMON
    }  # fmt: skip
    taken = {}
    for name, value in offered.items():
        if name in declared:
            taken[name] = value
        elif name not in CONTEXT and value != SHARED.get(name, value):
            raise ValueError(
                f"explorer.rollout_model.{name}: the {cls.__name__} engine has no such setting "
                f"(its own: {', '.join(declared) or 'none'}); leave it at {SHARED[name]!r} or choose another engine"
            )
    for name, value in own.items():
        if name not in declared:
            raise ValueError(
                f"explorer.rollout_model.engine_options.{name}: not an option of the {cls.__name__} engine "
                f"(its options: {', '.join(declared) or 'none'})"
            )
        taken[name] = value
    return taken
