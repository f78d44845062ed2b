"""Metrics to Weights & Biases (needs the wandb package: pip install 'rlcore[tracking]')."""

from __future__ import annotations

import os
from typing import Any

from .base import Monitor


class WandbMonitor(Monitor):
    """One W&B run per rlcore run: project and name from the config, the resolved config as its config."""

    def __init__(self, run_dir: str, project: str, name: str, config: dict[str, Any]):
        import wandb  # only when selected; check_monitor_dependencies explains a missing package

        os.makedirs(run_dir, exist_ok=True)
        self._run = wandb.init(project=project, name=name, config=config, dir=run_dir)

    @classmethod
    def from_run(cls, run_dir: str, project: str, name: str, config: dict[str, Any]) -> WandbMonitor:
        return cls(run_dir, project, name, config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """A W&B table `completions` per step."""
        import wandb

        if not rows:
            return
        columns = ["prompt", "response", "reward", "finish_reason", "group", "counts"]
        data = [
            [
                r["prompt"],
                r["response"],
                r["reward"],
                r["finish_reason"],
                r["group"],
                str(r.get("counts", {})),
            ]
            for r in rows
        ]
        self._run.log({"completions": wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self._run.finish()
