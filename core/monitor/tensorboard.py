"""Metrics as TensorBoard scalars under `<run_dir>/tensorboard` (needs the tensorboard package)."""

from __future__ import annotations

import json
import os
from typing import Any

from .base import Monitor


class TensorBoardMonitor(Monitor):
    """Scalars (and the completions' text) in event files under `<run_dir>/tensorboard`, one file per
    launch. A resumed run's file starts by purging from the step after `resumed_at`: TensorBoard
    hides what earlier files hold from there on, so each step shows the values logged last."""

    def __init__(self, run_dir: str, resumed_at: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard; only when selected

        self.log_dir = os.path.join(run_dir, "tensorboard")
        purge_step = None if resumed_at is None else resumed_at + 1
        self._writer = SummaryWriter(log_dir=self.log_dir, purge_step=purge_step)

    @classmethod
    def from_run(
        cls, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ) -> TensorBoardMonitor:
        return cls(run_dir, resumed_at)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()  # one call per step: cheap, and a live TensorBoard sees every step

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """A markdown table under the Text tab, tag `completions`."""
        if not rows:
            return
        cells = [
            [
                str(r["prompt"]),
                str(r["response"]),
                f"{r['reward']:.4g}",
                str(r["finish_reason"]),
                json.dumps(r.get("counts", {})),
            ]
            for r in rows
        ]
        table = "| prompt | response | reward | finish | counts |\n|---|---|---|---|---|\n" + "".join(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", "<br>") for c in row) + " |\n"
            for row in cells
        )
        self._writer.add_text("completions", table, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
