"""Metrics to Weights & Biases (needs the wandb package: pip install 'rlcore[tracking]')."""

from __future__ import annotations

import os
from typing import Any

from .base import Monitor, remember_id, remembered_id

RUN_ID_FILE = "wandb_run_id"
"""The W&B run's id, kept in the run folder: a resumed run continues that W&B run."""


class WandbMonitor(Monitor):
    """One W&B run per rlcore run: project and name from the config, the resolved config as its
    config. Its id is kept in the run folder, so a resumed run (continue_from_checkpoint) logs on
    into the same W&B run instead of starting a second one."""

    def __init__(self, run_dir: str, project: str, name: str, config: dict[str, Any]):
        import wandb  # only when selected; check_monitor_dependencies explains a missing package

        os.makedirs(run_dir, exist_ok=True)
        run_id = remembered_id(run_dir, RUN_ID_FILE)
        self._run = wandb.init(
            project=project, name=name, config=config, dir=run_dir, id=run_id,
            resume="allow" if run_id else None,
        )  # fmt: skip
        if run_id is None:
            remember_id(run_dir, RUN_ID_FILE, self._run.id)

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
