"""Load a YAML recipe + command-line overrides into the typed schema, and resolve stages.

Every failure is a `ConfigError` whose message is one line naming the full key path and what is
allowed. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from .schema import STAGE_SECTIONS, RLCoreConfig
from .validate import ConfigError, validate_config


@dataclass
class Stage:
    """One resolved stage: its name, index and the full config it runs with."""

    index: int
    name: str
    config: RLCoreConfig


def _allowed_keys(node: Any) -> str:
    if isinstance(node, DictConfig):
        return ", ".join(str(k) for k in node.keys())
    return ""


def _explain(err: OmegaConfBaseException, base: DictConfig | None, prefix: str = "") -> ConfigError:
    """Turn an OmegaConf exception into a one-line ConfigError with the full key path."""
    key = getattr(err, "full_key", None) or getattr(err, "key", None) or ""
    key = f"{prefix}{key}"
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, ConfigKeyError) and base is not None:
        parent_path = key.rsplit(".", 1)[0] if "." in key else ""
        parent_path = parent_path[len(prefix):] if prefix and parent_path.startswith(prefix) else parent_path
        parent = OmegaConf.select(base, parent_path) if parent_path else base
        allowed = _allowed_keys(parent)
        return ConfigError(f"{key}: unknown key; allowed keys here: {allowed}")
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(f"{key}: required but not set")
    if isinstance(err, InterpolationResolutionError):
        return ConfigError(f"{key}: cannot resolve interpolation ({msg})")
    if isinstance(err, ValidationError):
        return ConfigError(f"{key}: {msg}")
    return ConfigError(f"{key}: {msg}" if key else msg)


def _read_yaml(path: str) -> DictConfig:
    if not os.path.isfile(path):
        raise ConfigError(f"config file '{path}' not found")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        first = str(e).replace("\n", " ")
        raise ConfigError(f"{path}: invalid YAML ({first})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return OmegaConf.create(data)


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override '{item}' must be written key.path=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad override: {str(e).splitlines()[0]}") from None


def _merge(schema: DictConfig, *layers: DictConfig, prefix: str = "") -> DictConfig:
    merged = schema
    for layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise _explain(e, schema, prefix) from None
    return merged


def _to_object(cfg: DictConfig, prefix: str = "") -> RLCoreConfig:
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, cfg, prefix) from None
    assert isinstance(obj, RLCoreConfig)
    return obj


def load_config(path: str, overrides: list[str] | None = None, strategy: str | None = None) -> DictConfig:
    """Read `path`, apply `key=value` overrides and `--strategy`; return the merged, typed DictConfig.

    The result is in struct mode and checked against the schema (unknown keys, types). Call
    `resolve_stages` for fully validated dataclass configs.
    """
    schema = OmegaConf.structured(RLCoreConfig)
    layers = [_read_yaml(path), _parse_overrides(overrides or [])]
    if strategy is not None:
        layers.append(OmegaConf.create({"trainer": {"strategy": strategy}}))
    cfg = _merge(schema, *layers)
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
        return [Stage(0, "main", obj)]

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
            if key not in STAGE_SECTIONS:
                raise ConfigError(f"{prefix}{key}: a stage may override only {', '.join(STAGE_SECTIONS)}")
        inherits_model = i > 0 and "model_path" not in (raw.get("model") or {})
        stage_cfg = _merge(base, OmegaConf.create(raw), prefix=prefix)
        if inherits_model:
            with _unlocked(stage_cfg):
                # Placeholder so validation passes; the runner points it at the previous stage's export.
                stage_cfg.model.model_path = _PREVIOUS_STAGE
        obj = _to_object(stage_cfg, prefix)
        try:
            validate_config(obj, check_paths=check_paths)
        except ConfigError as e:
            raise ConfigError(f"{prefix}{e}") from None
        stages.append(Stage(i, name, obj))
    return stages


_PREVIOUS_STAGE = "<previous stage>"


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
        cfg = OmegaConf.structured(cfg)
    try:
        return OmegaConf.to_yaml(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise _explain(e, cfg) from None


def from_yaml(text: str) -> RLCoreConfig:
    """Rebuild a config written by `to_yaml` (used to hand a stage's config to trainer ranks)."""
    schema = OmegaConf.structured(RLCoreConfig)
    cfg = OmegaConf.merge(schema, OmegaConf.create(text))
    return _to_object(cfg)
