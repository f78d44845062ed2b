"""Typed configuration: schema (defaults), loading with overrides, validation, stages."""

from .loader import (
    Stage,
    from_yaml,
    inherits_previous_model,
    load_config,
    resolve_stages,
    to_yaml,
)
from .recipes import read_recipe
from .schema import RLCoreConfig
from .validate import ConfigError

__all__ = [
    "ConfigError",
    "RLCoreConfig",
    "Stage",
    "from_yaml",
    "inherits_previous_model",
    "load_config",
    "read_recipe",
    "resolve_stages",
    "to_yaml",
]
