"""A taskset's reward model named by its stage: `reward_model.path: stage:<name>` is the export of the
run's earlier stage `<name>`, an algorithm_type reward_model stage (SFT -> reward model -> RL in one
run, configs/reward_model.yaml). The config check refuses a name that is not such a stage; the loop
writes the stage's export in before the stage that reads it runs."""

from __future__ import annotations

import copy
from typing import Any

from .errors import ConfigError

STAGE_PREFIX = "stage:"


def stage_named(path: str | None) -> str | None:
    """The stage a reward_model.path names ('stage:<name>'), or None for a folder."""
    return path[len(STAGE_PREFIX) :] if path is not None and path.startswith(STAGE_PREFIX) else None


def _refs(cfg: Any) -> list[tuple[str, Any, str]]:
    """(config key, taskset, stage name) of the tasksets whose reward model is a stage's."""
    from ..data.taskset import tasksets_of

    return [
        (key, ts, name) for key, ts in tasksets_of(cfg)
        if "reward_model" in ts.reward_fn and (name := stage_named(ts.reward_model.path)) is not None
    ]  # fmt: skip


def check_stage_refs(stages: list[Any]) -> None:
    """Each stage's tasksets name (reward_model.path 'stage:<name>') only earlier reward_model stages
    (`stages`: loader.Stage, in order)."""
    for i, stage in enumerate(stages):
        earlier = {s.name: s for s in stages[:i]}
        for key, _, name in _refs(stage.config):
            where = f"stages[{i}].{key}.reward_model.path" if len(stages) > 1 else f"{key}.reward_model.path"
            if name not in earlier:
                raise ConfigError(
                    f"{where}: 'stage:{name}' names no earlier stage of this run (earlier: "
                    f"{', '.join(earlier) or 'none'}); name an algorithm_type reward_model stage before it, or give a folder"
                )
            if earlier[name].plan.trained_model != "reward":
                raise ConfigError(
                    f"{where}: stage {name} trains a policy, not a reward model; name a stage with algorithm_type reward_model"
                )


def with_stage_exports(cfg: Any, exports: dict[str, str]) -> Any:
    """`cfg` with each 'stage:<name>' reward model replaced by that stage's export (`exports`: stage
    name -> its final HF folder); `cfg` itself when it names none."""
    refs = _refs(cfg)
    if not refs:
        return cfg
    cfg = copy.deepcopy(cfg)
    for key, ts, name in _refs(cfg):
        if not exports.get(name):
            raise ValueError(f"{key}.reward_model.path: stage {name} has no export to score with (it saved no HF folder)")
        ts.reward_model.path = exports[name]
    return cfg
