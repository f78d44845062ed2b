"""Engines in the trainer's own process (mode colocate, and evaluation in modes train and bench),
across the stages of one launch.

Most engines are built for a stage and closed after it. An in-process vLLM engine cannot be: its
teardown destroys the process's default group, which is the trainer's world, and its groups are
built over that world (in a world of several ranks every rank must build it, together). So it is
built once per process and serves every later stage that asks for the same settings. A reused
engine still holds the previous stage's weights: the trainer pushes its own before first use.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from . import build_engine
from .base import RolloutEngine
from .spec import EngineSpec

log = logging.getLogger("rlcore.rollout.in_process")

PROCESS_WIDE = frozenset({"vllm"})
"""Engine types whose in-process engine lives until the process exits and, in a trainer world of
several ranks, must be built by every rank together."""

_IGNORED_MODEL_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")


@dataclass
class _Kept:
    settings: dict[str, Any]
    model_path: str
    engine: RolloutEngine


_kept: _Kept | None = None


def acquire(spec: EngineSpec) -> tuple[RolloutEngine, bool]:
    """This stage's in-process engine (`spec`: engine_spec's with in_process) and whether an earlier
    stage built it (then it holds that stage's weights, not `spec.model_path`'s)."""
    global _kept
    settings = {k: v for k, v in asdict(spec).items() if k != "model_path"}
    if _kept is not None:
        changed = _differences(_kept.settings, settings)
        if changed:
            raise ValueError(
                f"the in-process {_kept.settings['engine_type']} engine an earlier stage built serves every "
                f"later stage, but this stage asks for other settings ({changed}): give every stage that "
                "runs an engine in process the same engine settings"
            )
        _check_same_model(_kept.model_path, spec.model_path)
        log.info("reusing the in-process %s engine an earlier stage built", spec.engine_type)
        return _kept.engine, True
    engine = build_engine(spec)
    if spec.engine_type in PROCESS_WIDE:
        _kept = _Kept(settings, spec.model_path, engine)
    return engine, False


def release(engine: RolloutEngine) -> None:
    """The stage is done with `engine`: close it, unless it is the process-wide one (kept for the
    next stage; it goes with the process)."""
    if _kept is None or _kept.engine is not engine:
        engine.close()


def _check_same_model(built_for: str, model_path: str) -> None:
    """A reused engine takes the new stage's weights by name and shape: refuse another architecture."""
    if built_for == model_path:
        return
    from transformers import AutoConfig

    old, new = (AutoConfig.from_pretrained(p).to_dict() for p in (built_for, model_path))
    for key in _IGNORED_MODEL_KEYS:
        old.pop(key, None)
        new.pop(key, None)
    changed = _differences(old, new)
    if changed:
        raise ValueError(
            f"model {model_path} is not the architecture the in-process engine was built for in an earlier "
            f"stage ({built_for}; {changed}): "
            "stages that run an engine in process must train the same architecture; run the others as a "
            "separate launch"
        )


def _differences(old: dict[str, Any], new: dict[str, Any], most: int = 4) -> str:
    """'key: old -> new' for the first `most` keys whose values differ ('' when none do)."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:most])
