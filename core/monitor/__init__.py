"""Monitors: where metrics go. Selected by `monitor.monitor_type`, built lazily by name.

`check_monitor_dependencies` runs at config-validation time and never imports the tracking
packages, so `rlcore config validate` stays fast and a missing package fails before any training.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..registry import Registry
from .base import Monitor, MultiMonitor

MONITORS = Registry(
    "monitor.monitor_type",
    {
        "console": "rlcore.core.monitor.console:ConsoleMonitor",
        "jsonl": "rlcore.core.monitor.jsonl:JsonlMonitor",
        "tensorboard": "rlcore.core.monitor.tensorboard:TensorBoardMonitor",
        "wandb": "rlcore.core.monitor.wandb:WandbMonitor",
        "mlflow": "rlcore.core.monitor.mlflow:MlflowMonitor",
    },
)

# the optional package each monitor imports (all in the `tracking` extra)
REQUIRED_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def check_monitor_dependencies(types: list[str]) -> None:
    """Raise ValueError when a selected monitor is unknown or its package is not installed."""
    for name in types:
        MONITORS.check(name)
        package = REQUIRED_PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ValueError(
                f"{MONITORS.key_path} '{name}' needs the {package} package: pip install 'rlcore[tracking]'"
            )


def build_monitors(
    types: list[str], run_dir: str, project: str, name: str, config: dict[str, Any],
    resumed_at: int | None = None,
) -> MultiMonitor:  # fmt: skip
    """Build every selected monitor; `config` is the resolved run config as plain containers,
    `resumed_at` the step a resumed run takes up from (`Monitor.from_run`)."""
    check_monitor_dependencies(types)
    return MultiMonitor(
        [MONITORS.resolve(t).from_run(run_dir, project, name, config, resumed_at) for t in types]
    )


__all__ = ["MONITORS", "Monitor", "MultiMonitor", "build_monitors", "check_monitor_dependencies"]
