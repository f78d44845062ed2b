"""Load a YAML recipe + command-line overrides into the typed schema, and resolve stages.

Every failure is a `ConfigError` whose message is one line naming the full key path and what is
allowed. Nothing here imports torch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import sys
import typing
from dataclasses import dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import typed_yaml
from .layer_checks import (
    explain,
    hints,
    is_section,
    layer_problems,
    open_free_dicts,
    optional_section,
    schema_node,
    stage_problems,
)
from .moved_keys import move_keys
from .plan import StagePlan, filled, plan_stage, pushes_to_explorer, syncs_engines
from .recipes import read_recipe
from .schema import STAGE_SECTIONS, RLCoreConfig, SynchronizerConfig
from .section_checks import check_algorithm_sections
from .shape_checks import check_stages
from .stage_refs import check_stage_refs
from .unknown_keys import unknown_key_problems
from .validate import ConfigError, validate_config


@dataclass
class Stage:
    """One resolved stage: its name, index, the full config it runs with (validated, with what the
    plan fills in written: plan.filled) and its plan."""

    index: int
    name: str
    config: RLCoreConfig
    plan: StagePlan

    @classmethod
    def resolved(cls, index: int, name: str, cfg: RLCoreConfig) -> Stage:
        """The stage of a validated config: the plan's values filled in, the plan made."""
        cfg = filled(cfg)
        return cls(index, name, cfg, plan_stage(cfg, index, name))


def _parse_overrides(overrides: list[str]) -> list[dict[str, Any]]:
    """One layer per `key.path=value` override, in order, parsed by OmegaConf's dotlist grammar."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override '{item}' must be written key.path=value")
    layers: list[dict[str, Any]] = []
    for item in overrides:
        try:
            layer = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
        except (OmegaConfBaseException, yaml.YAMLError) as e:
            lines = str(e).splitlines()
            first = lines[0] if isinstance(e, OmegaConfBaseException) else " ".join(" ".join(lines).split())
            raise ConfigError(f"override '{item}': cannot parse the value ({first})") from None
        assert isinstance(layer, dict)
        layers.append({str(k): v for k, v in layer.items()})
    return layers


def _reach_into_lists(update: Any, current: Any, path: str, root: Any, inherited: Any = None) -> Any:
    """Let an override layer reach into lists: `stages.1.mode=train`, `...eval_tasksets.0.split=test`.

    OmegaConf.from_dotlist reads those keys as {"stages": {"1": {...}}}, a mapping, which merge
    refuses for a list. Where the config so far (`current`, plain containers) holds a list, the
    mapping of indices becomes a copy of that list with those elements updated: merging it replaces
    the list, and the layer check then sees every element under its full path. (OmegaConf.update on
    the merged config takes list indices too, but accepts -1, raises a bare TypeError for a
    non-integer, and calls an index past the end of a list of sections a type error.)

    A stage starts from the global config (`root`), so a list it does not set is `inherited` from
    there: `stages.1.buffer.explorer_input.eval_tasksets.0.split=test` copies the global list.
    """
    if not isinstance(update, dict):
        return update
    if current is None:
        current = inherited
    if isinstance(current, list):
        items = list(current)
        for key, value in update.items():
            i = _list_index(key, len(items), path)
            stage_base = root if path == "stages" else None
            items[i] = _deep_merge(
                items[i], _reach_into_lists(value, items[i], f"{path}[{i}]", root, stage_base)
            )
        return items
    if isinstance(current, dict):
        below = inherited if isinstance(inherited, dict) else {}
        return {
            k: _reach_into_lists(v, current.get(k), f"{path}.{k}" if path else k, root, below.get(k))
            for k, v in update.items()
        }
    return update


def _list_index(key: str, size: int, path: str) -> int:
    """`key` of an override as an index into the list at `path`, which has `size` elements."""
    if size == 0:
        elements = f"{path} is empty; set the whole list: {path}=[...]"
    elif size == 1:
        elements = f"{path} has 1 element: 0"
    else:
        elements = f"{path} has {size} elements: 0 to {size - 1}"
    if re.fullmatch(r"-?[0-9]+", key) is None:
        raise ConfigError(f"{path}.{key}: expected a list index, got '{key}' ({elements})")
    if not 0 <= int(key) < size:
        raise ConfigError(f"{path}[{key}]: index out of range ({elements})")
    return int(key)


def _deep_merge(base: Any, update: Any) -> Any:
    """Mappings merge key by key; anything else (lists included) is replaced, as in OmegaConf.merge."""
    if isinstance(base, dict) and isinstance(update, dict):
        return {**base, **{k: _deep_merge(base.get(k), v) for k, v in update.items()}}
    return update


def _merge(base: DictConfig, data: dict[str, Any], prefix: str = "") -> DictConfig:
    """`data` over a copy of `base`, checked against the schema first; errors name keys after `prefix`."""
    problems = layer_problems(RLCoreConfig, data, prefix)
    if problems:
        raise ConfigError.of(problems)
    merged = copy.deepcopy(base)  # (what OmegaConf.merge does first) before filling: `base` stays as it was
    _fill_optional_sections(merged, data, RLCoreConfig)
    open_free_dicts(merged)
    try:
        merged.merge_with(data)
    except OmegaConfBaseException as e:
        raise explain(e, prefix) from None
    return merged


def _fill_optional_sections(base: DictConfig, data: dict[Any, Any], cls: type) -> None:
    """An optional section (`expert_taskset: TasksetConfig | None`) that `data` sets while `base`
    leaves it null starts from the section's defaults, so the layer merges into a typed section."""
    fields = hints(cls)
    for key, value in data.items():
        hint = fields.get(key)
        section = optional_section(hint) if hint is not None else None
        if section is not None and isinstance(value, dict) and base.get(key) is None:
            with _unlocked(base):
                base[key] = copy.deepcopy(schema_node(section))
        elif hint is not None and is_section(hint) and isinstance(value, dict) and key in base:
            _fill_optional_sections(base[key], value, hint)


def _to_object(cfg: DictConfig, prefix: str = "") -> RLCoreConfig:
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise explain(e, prefix) from None
    assert isinstance(obj, RLCoreConfig)
    return obj


def load_config(path: str, overrides: list[str] | None = None, strategy: str | None = None) -> DictConfig:
    """Read `path`, apply `key=value` overrides and `--strategy`; return the merged, typed DictConfig.

    An override's key may index into lists, stages included: `stages.1.algorithm.optimizer.lr=1e-5`
    (or `stages[1]...`) changes stage 1 only.

    The result is in struct mode and checked against the schema (unknown keys, types). Call
    `resolve_stages` for fully validated dataclass configs.
    """
    notes: list[str] = []
    data = read_recipe(path, notes)
    override_layers = _parse_overrides(overrides or [])
    for layer in override_layers:
        notes += [f"override: {note}" for note in move_keys(layer, where="override: ")]
    for note in dict.fromkeys(notes):  # a moved key: one line each, before any check reads the config
        print(f"rlcore: note: {note}", file=sys.stderr)
    problems = layer_problems(RLCoreConfig, data, "") + stage_problems(data.get("stages"))
    if problems:  # every one of the file's, in one run
        raise ConfigError.of(problems)
    merged = data
    for layer in override_layers:  # in order: a later override wins
        current = _with_defaults(RLCoreConfig, merged)
        layer = _reach_into_lists(layer, current, "", root=current)
        problems = layer_problems(RLCoreConfig, layer, "")
        if problems:
            raise ConfigError.of(problems)
        merged = _deep_merge(merged, layer)
    if strategy is not None:
        merged = _deep_merge(merged, {"trainer": {"strategy": strategy}})
    cfg = copy.deepcopy(schema_node(RLCoreConfig))  # then the layers, merged above as plain data, in one pass
    _fill_optional_sections(cfg, merged, RLCoreConfig)
    try:
        cfg.merge_with(merged)
    except OmegaConfBaseException as e:
        raise explain(e) from None
    OmegaConf.set_struct(cfg, True)
    return cfg


@functools.cache
def _defaults(cls: type) -> dict[str, Any]:
    """`cls`'s defaults as plain data (shared: not to be changed)."""
    data = OmegaConf.to_container(schema_node(cls), resolve=False)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}  # a schema's keys are its fields' names


def _with_defaults(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """`data` over `cls`'s defaults, each element of a list of sections over its section's (as
    OmegaConf holds them once merged), as plain data: what an override reaches into."""
    fields = hints(cls)
    out = dict(_defaults(cls))
    for key, value in data.items():
        hint = fields.get(key)
        section = typed_yaml.section_of(hint)
        item = typed_yaml.section_of(typing.get_args(hint)[0]) if typing.get_origin(hint) is list else None
        if section is not None and isinstance(value, dict):
            out[key] = _with_defaults(section, value)
        elif item is not None and isinstance(value, list):
            out[key] = [_with_defaults(item, v) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    return out


def resolve_stages(cfg: DictConfig, check_paths: bool = True) -> list[Stage]:
    """Validate the config and return one resolved config per stage (one stage when none are given).

    A stage's overrides are applied on top of the global config (without `stages`); a stage
    that sets no `model.model_path` starts from the previous stage's final weights, which the
    runner fills in at run time.
    """
    raw_stages = OmegaConf.to_container(cfg.stages, resolve=False) if cfg.stages else []
    if not raw_stages:
        obj = _to_object(cfg)
        validate_config(obj, check_paths=check_paths)
        check_algorithm_sections(obj.algorithm, [("", obj.algorithm, {})])
        only = [Stage.resolved(0, "main", obj)]
        check_stage_refs(only)
        return only

    stages: list[Stage] = []
    own_algorithm: list[dict[str, Any]] = []  # what each stage sets under `algorithm` itself
    seen: set[str] = set()
    for i, raw in enumerate(raw_stages):
        prefix = f"stages[{i}]."
        if not isinstance(raw, dict):
            raise ConfigError(f"stages[{i}]: must be a mapping with a name and section overrides")
        raw = dict(raw)
        name = raw.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"stages[{i}].name: required (a short identifier, e.g. sft_warmup)")
        if name in seen:
            raise ConfigError(f"stages[{i}].name: '{name}' is used by an earlier stage; names must be unique")
        seen.add(name)
        for key in raw:
            if key in STAGE_SECTIONS:
                continue
            if key in hints(RLCoreConfig):
                raise ConfigError(f"{prefix}{key}: a stage may override only {', '.join(STAGE_SECTIONS)}")
            raise ConfigError.of(
                unknown_key_problems(f"{prefix}{key}", key, raw[key], ["name", *STAGE_SECTIONS])
            )
        stage_cfg = _merge(cfg, raw, prefix=prefix)  # checks the sections' shapes
        _drop_engine_sync_settings(stage_cfg, raw)
        with _unlocked(stage_cfg):
            stage_cfg.stages = []  # the global config without `stages`, this stage's sections over it
            if i > 0 and "model_path" not in (raw.get("model") or {}):
                # Placeholder so validation passes; the runner points it at the previous stage's export.
                stage_cfg.model.model_path = _PREVIOUS_STAGE
        obj = _to_object(stage_cfg, prefix)
        try:
            validate_config(obj, check_paths=check_paths)
        except ConfigError as e:
            raise ConfigError(f"{prefix}{e}") from None
        stages.append(Stage.resolved(i, name, obj))
        own_algorithm.append(raw.get("algorithm") or {})
    check_algorithm_sections(
        OmegaConf.to_object(cfg.algorithm),  # type: ignore[arg-type]  # the run-wide section, typed
        [(f"stages[{s.index}].", s.config.algorithm, own) for s, own in zip(stages, own_algorithm, strict=True)],
    )
    check_stages([s.config for s in stages])
    check_stage_refs(stages)
    return stages


_PREVIOUS_STAGE = "<previous stage>"

ENGINE_SYNC_KEYS = ("sync_method", "checksums", "probe", "probe_tolerance", "rollout_ahead", "asynchronous")
"""synchronizer keys that concern weights reaching the engines of a syncing mode (or its explorer)."""


def _drop_engine_sync_settings(stage_cfg: DictConfig, raw: dict[str, Any]) -> None:
    """A run-wide synchronizer setting applies to the stages that sync: a stage whose mode does not
    (train, explore, bench) gets the schema default for each ENGINE_SYNC_KEYS key it does not set
    itself, except sync_method nccl in modes train and explore (a decoupled run's weights over a
    group: plan.explorer_weights). One it sets itself is checked as given (validation refuses what
    cannot apply)."""
    if syncs_engines(stage_cfg):
        return
    own = raw.get("synchronizer") or {}
    defaults = SynchronizerConfig()
    decoupled = pushes_to_explorer(stage_cfg)
    with _unlocked(stage_cfg):
        for key in ENGINE_SYNC_KEYS:
            if key not in own and not (decoupled and key == "sync_method"):
                stage_cfg.synchronizer[key] = getattr(defaults, key)


def inherits_previous_model(cfg: RLCoreConfig) -> bool:
    return cfg.model.model_path == _PREVIOUS_STAGE


class _unlocked:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    def __enter__(self) -> DictConfig:
        OmegaConf.set_struct(self.cfg, False)
        return self.cfg

    def __exit__(self, *exc: object) -> None:
        OmegaConf.set_struct(self.cfg, True)


def to_yaml(cfg: DictConfig | RLCoreConfig) -> str:
    """The fully resolved config as YAML (what `rlcore config show` prints)."""
    if dataclasses.is_dataclass(cfg):
        text = typed_yaml.dump(cfg)  # what OmegaConf writes for it, without building its nodes
        if text is not None:
            return text
        cfg = OmegaConf.structured(cfg)
    try:
        return OmegaConf.to_yaml(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise explain(e) from None


def from_yaml(text: str) -> RLCoreConfig:
    """Rebuild a config written by `to_yaml` (used to hand a stage's config to trainer ranks, and by a
    trainer service's clients, whose older keys are moved as a launch moves them)."""
    typed = typed_yaml.load(RLCoreConfig, text)
    if typed is not None:
        return typed
    schema = OmegaConf.structured(RLCoreConfig)  # converts what it can, or says which key is wrong
    data = yaml.safe_load(text)
    if isinstance(data, dict):
        move_keys(data)  # an older client's keys (moved_keys.py), as a launch reads them
    try:
        cfg = OmegaConf.merge(schema, OmegaConf.create(data if isinstance(data, dict) else text))
    except OmegaConfBaseException as e:
        raise explain(e) from None
    assert isinstance(cfg, DictConfig)
    return _to_object(cfg)
