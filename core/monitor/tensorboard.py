"""Metrics as TensorBoard scalars under `<run_dir>/tensorboard` (needs the tensorboard package)."""

from __future__ import annotations

import os

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

    def close(self) -> None:
        self._writer.close()
