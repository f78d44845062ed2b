"""Load a YAML recipe + command-line overrides into the typed schema, and resolve stages.

Every failure is a `ConfigError` whose message is one line naming the full key path and what is
allowed. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    InterpolationValidationError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from . import typed_yaml
from .plan import StagePlan, filled, plan_stage, pushes_to_explorer, syncs_engines
from .recipes import read_recipe
from .schema import STAGE_SECTIONS, RLCoreConfig
from .shape_checks import check_stages
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


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(hint: Any) -> typing.TypeGuard[type]:
    """A schema dataclass (a section or a list item type), as opposed to a scalar or container."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _optional_section(hint: Any) -> type | None:
    """The section of an optional section field (`TasksetConfig | None`), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        sections = [a for a in typing.get_args(hint) if _is_section(a)]
        if len(sections) == 1 and type(None) in typing.get_args(hint):
            return sections[0]
    return None


def _type_name(hint: Any) -> str:
    """How a schema type reads in an error message: int, float or null, a list of str..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"a list of {_type_name(args[0])}" if args and args[0] is not Any else "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "a mapping"
    if hint is bool:
        return "true or false"
    return getattr(hint, "__name__", str(hint))


def _show(value: Any) -> str:
    """A user value as the YAML/override writer typed it."""
    if value is None:
        return "null"
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    return repr(value)


def _expected_type(err: OmegaConfBaseException) -> str | None:
    """The schema type of the value an OmegaConf ValidationError complains about."""
    obj, key = getattr(err, "object_type", None), getattr(err, "key", None)
    ref = getattr(err, "ref_type", None)
    if _is_section(obj) and isinstance(key, str) and key in _hints(obj):
        return _type_name(_hints(obj)[key])
    if isinstance(key, int) and typing.get_origin(ref) is list:  # a list element
        return _type_name(typing.get_args(ref)[0])
    return None


def _explain(err: OmegaConfBaseException, prefix: str = "") -> ConfigError:
    """Turn an OmegaConf exception into a one-line ConfigError with the full key path."""
    rel = getattr(err, "full_key", None) or getattr(err, "key", None) or ""
    key = f"{prefix}{rel}"
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    obj = getattr(err, "object_type", None)
    if isinstance(err, ConfigKeyError) and _is_section(obj):
        return ConfigError.of(unknown_key_problems(key, getattr(err, "key", rel), None, list(_hints(obj))))
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(f"{key}: required but not set (set it in the YAML or pass {key}=...)")
    if isinstance(err, GrammarParseError):
        return ConfigError(f"{key}: malformed interpolation {_show(getattr(err, 'value', None))} ({msg})")
    if isinstance(err, ValidationError) and (expected := _expected_type(err)) is not None:
        source = " (from an interpolation)" if isinstance(err, InterpolationValidationError) else ""
        return ConfigError(f"{key}: expected {expected}, got {_show(getattr(err, 'value', None))}{source}")
    if isinstance(err, InterpolationResolutionError):
        return ConfigError(f"{key}: cannot resolve interpolation ({msg})")
    return ConfigError(f"{key}: {msg}" if key else msg)


def _layer_problems(cls: type, data: dict[Any, Any], path: str) -> list[str]:
    """A layer's problems with the schema's keys and section shapes, one line each (every unknown
    key of a file in one run), found before OmegaConf merges it.

    OmegaConf names an error inside a list element relative to the element, and reports a scalar
    given for a whole section without any key; walking the layer first keeps the full key path.
    Scalar types are left to OmegaConf (it converts "3" to 3 and resolves interpolations).
    """
    hints = _hints(cls)
    problems: list[str] = []
    for key, value in data.items():
        full = f"{path}{key}"
        if key not in hints:
            problems += unknown_key_problems(full, key, value, list(hints))
            continue
        hint = hints[key]
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: checked once resolved
        if _optional_section(hint) is not None:
            if value is None:
                continue
            hint = _optional_section(hint)
        origin = typing.get_origin(hint)
        if _is_section(hint) or origin is dict:
            if not isinstance(value, dict):
                problems.append(f"{full}: expected a mapping of {key} keys, got {_show(value)}")
            elif _is_section(hint):
                problems += _layer_problems(hint, value, full + ".")
        elif origin is list:
            if not isinstance(value, list):
                problems.append(f"{full}: expected {_type_name(hint)}, got {_show(value)}")
                continue
            (item_type,) = typing.get_args(hint)
            if _is_section(item_type):
                for i, item in enumerate(value):
                    problems += _item_problems(item_type, item, f"{full}[{i}]")
    return problems


def _item_problems(cls: type, item: Any, path: str) -> list[str]:
    if not isinstance(item, dict):
        return [f"{path}: expected a mapping of {cls.__name__} keys, got {_show(item)}"]
    problems = _layer_problems(cls, item, path + ".")
    if problems:
        return problems
    try:  # scalar types, merged alone so the error can carry the element's path
        OmegaConf.merge(OmegaConf.structured(cls), item)
    except OmegaConfBaseException as e:
        return str(_explain(e, path + ".")).splitlines()
    return []


def _stage_problems(stages: Any) -> list[str]:
    """The problems of a recipe's `stages` with their keys, one line each (resolve_stages checks
    the rest, stage by stage)."""
    if not isinstance(stages, list):
        return []
    problems: list[str] = []
    for i, raw in enumerate(stages):
        if not isinstance(raw, dict):
            continue
        for key, value in raw.items():
            path = f"stages[{i}].{key}"
            if key in STAGE_SECTIONS:
                problems += _layer_problems(RLCoreConfig, {key: value}, f"stages[{i}].")
            elif key not in _hints(RLCoreConfig):
                problems += unknown_key_problems(path, key, value, ["name", *STAGE_SECTIONS])
    return problems


def _read_yaml(path: str) -> DictConfig:
    data = read_recipe(path)
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as e:  # e.g. a malformed ${...} interpolation
        raise _explain(e) from None


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


def _merge(base: DictConfig, layer: DictConfig | dict[str, Any], prefix: str = "") -> DictConfig:
    """`layer` over `base`, checked against the schema first; errors name keys after `prefix`."""
    data = OmegaConf.to_container(layer, resolve=False) if isinstance(layer, DictConfig) else layer
    assert isinstance(data, dict)
    problems = _layer_problems(RLCoreConfig, data, prefix)
    if problems:
        raise ConfigError.of(problems)
    _fill_optional_sections(base, data, RLCoreConfig)
    _open_free_dicts(base)
    try:
        merged = OmegaConf.merge(base, data)
    except OmegaConfBaseException as e:
        raise _explain(e, prefix) from None
    assert isinstance(merged, DictConfig)
    return merged


def _fill_optional_sections(base: DictConfig, data: dict[Any, Any], cls: type) -> None:
    """An optional section (`expert_taskset: TasksetConfig | None`) that `data` sets while `base`
    leaves it null starts from the section's defaults, so the layer merges into a typed section."""
    hints = _hints(cls)
    for key, value in data.items():
        hint = hints.get(key)
        section = _optional_section(hint) if hint is not None else None
        if section is not None and isinstance(value, dict) and base.get(key) is None:
            with _unlocked(base):
                base[key] = OmegaConf.structured(section)
        elif hint is not None and _is_section(hint) and isinstance(value, dict) and key in base:
            _fill_optional_sections(base[key], value, hint)


def _open_free_dicts(node: DictConfig) -> None:
    """Free-form `dict[str, Any]` fields (e.g. generator_args) accept new keys in every layer;
    struct mode keeps guarding the schema's own sections."""
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            if OmegaConf.get_type(child) is dict:
                OmegaConf.set_struct(child, False)
            else:
                _open_free_dicts(child)
        elif isinstance(child, ListConfig):
            for item in child:
                if isinstance(item, DictConfig):
                    _open_free_dicts(item)


def _to_object(cfg: DictConfig, prefix: str = "") -> RLCoreConfig:
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, prefix) from None
    assert isinstance(obj, RLCoreConfig)
    return obj


def load_config(path: str, overrides: list[str] | None = None, strategy: str | None = None) -> DictConfig:
    """Read `path`, apply `key=value` overrides and `--strategy`; return the merged, typed DictConfig.

    An override's key may index into lists, stages included: `stages.1.algorithm.optimizer.lr=1e-5`
    (or `stages[1]...`) changes stage 1 only.

    The result is in struct mode and checked against the schema (unknown keys, types). Call
    `resolve_stages` for fully validated dataclass configs.
    """
    recipe = _read_yaml(path)
    override_layers = _parse_overrides(overrides or [])
    data = OmegaConf.to_container(recipe, resolve=False)
    assert isinstance(data, dict)
    problems = _layer_problems(RLCoreConfig, data, "") + _stage_problems(data.get("stages"))
    if problems:  # every one of the file's, in one run
        raise ConfigError.of(problems)
    cfg = _merge(OmegaConf.structured(RLCoreConfig), recipe)
    for layer in override_layers:  # in order: a later override wins
        current = OmegaConf.to_container(cfg, resolve=False)
        cfg = _merge(cfg, _reach_into_lists(layer, current, "", root=current))
    if strategy is not None:
        cfg = _merge(cfg, {"trainer": {"strategy": strategy}})
    OmegaConf.set_struct(cfg, True)
    return cfg


def resolve_stages(cfg: DictConfig, check_paths: bool = True) -> list[Stage]:
    """Validate the config and return one resolved config per stage (one stage when none are given).

    A stage's overrides are applied on top of the global config (without `stages`); a stage
    that sets no `model.model_path` starts from the previous stage's final weights, which the
    runner fills in at run time.
    """
    raw_stages = OmegaConf.to_container(cfg.stages, resolve=False) if cfg.stages else []
    base = cfg.copy()
    with _unlocked(base):
        base.stages = []
    if not raw_stages:
        obj = _to_object(base)
        validate_config(obj, check_paths=check_paths)
        return [Stage.resolved(0, "main", obj)]

    stages: list[Stage] = []
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
            if key in _hints(RLCoreConfig):
                raise ConfigError(f"{prefix}{key}: a stage may override only {', '.join(STAGE_SECTIONS)}")
            raise ConfigError.of(
                unknown_key_problems(f"{prefix}{key}", key, raw[key], ["name", *STAGE_SECTIONS])
            )
        stage_cfg = _merge(base, raw, prefix=prefix)  # checks the sections' shapes
        _drop_engine_sync_settings(stage_cfg, raw)
        inherits_model = i > 0 and "model_path" not in (raw.get("model") or {})
        if inherits_model:
            with _unlocked(stage_cfg):
                # Placeholder so validation passes; the runner points it at the previous stage's export.
                stage_cfg.model.model_path = _PREVIOUS_STAGE
        obj = _to_object(stage_cfg, prefix)
        try:
            validate_config(obj, check_paths=check_paths)
        except ConfigError as e:
            raise ConfigError(f"{prefix}{e}") from None
        stages.append(Stage.resolved(i, name, obj))
    check_stages([s.config for s in stages])
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
    defaults = OmegaConf.structured(RLCoreConfig).synchronizer
    decoupled = pushes_to_explorer(stage_cfg)
    with _unlocked(stage_cfg):
        for key in ENGINE_SYNC_KEYS:
            if key not in own and not (decoupled and key == "sync_method"):
                stage_cfg.synchronizer[key] = defaults[key]


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
        raise _explain(e) from None


def from_yaml(text: str) -> RLCoreConfig:
    """Rebuild a config written by `to_yaml` (used to hand a stage's config to trainer ranks)."""
    typed = typed_yaml.load(RLCoreConfig, text)
    if typed is not None:
        return typed
    schema = OmegaConf.structured(RLCoreConfig)  # converts what it can, or says which key is wrong
    try:
        cfg = OmegaConf.merge(schema, OmegaConf.create(text))
    except OmegaConfBaseException as e:
        raise _explain(e) from None
    assert isinstance(cfg, DictConfig)
    return _to_object(cfg)
