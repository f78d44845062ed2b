"""Metrics as TensorBoard scalars under `<run_dir>/tensorboard` (needs the tensorboard package)."""

from __future__ import annotations

import json
import os
from typing import Any

from .base import Monitor


class TensorBoardMonitor(Monitor):
    def __init__(self, run_dir: str):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard; only when selected

        self.log_dir = os.path.join(run_dir, "tensorboard")
        self._writer = SummaryWriter(log_dir=self.log_dir)

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
