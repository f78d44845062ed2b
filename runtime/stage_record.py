"""Where a stage's progress goes: its monitors (metrics.jsonl and the configured trackers), the
progress bar on stdout, the run's controller (records and heartbeats: pause / stop), and a seeded
sample of the step's completions (monitor.log_completions)."""

from __future__ import annotations

import dataclasses
import random
import sys
from typing import Any

from ..core.config import Stage
from ..core.step_metrics import completion_rows
from ..core.types import Experience
from .engine_link import RunContext


class StageRecord:
    def __init__(self, stage: Stage, sdir: str, run: RunContext, total_steps: int, tokenizer: Any):
        self.stage, self.sdir, self.run, self.total_steps, self.tokenizer = stage, sdir, run, total_steps, tokenizer  # fmt: skip
        self.monitor: Any = None
        self.progress: Any = None

    def open(self, resumed_at: int | None = None) -> None:
        """Open the monitors and the progress bar; `resumed_at`: the step a resume took up from (each
        monitor drops what it holds past it: those steps are logged again)."""
        from ..core.monitor import build_monitors
        from ..core.monitor.progress import StepProgress

        cfg = self.stage.config
        self.monitor = build_monitors(
            list(cfg.monitor.monitor_type), self.sdir, cfg.project, f"{cfg.name}/{self.stage.name}",
            dataclasses.asdict(cfg), resumed_at=resumed_at,
        )  # fmt: skip
        # stdout: a run's stderr is for what went wrong (trainer ranks send it to a log file)
        self.progress = StepProgress(self.total_steps, desc=self.stage.name, file=sys.stdout)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not metrics:
            return
        if self.run.reporter is not None:
            self.run.reporter.record(self.stage.name, step, metrics)
        self.monitor.log(metrics, step)
        self.progress.update(step, metrics)

    def heartbeat(self, step: int, synced_step: int, wait: bool) -> str:
        """Report the step to the run's controller; 'stop' when the run asks to stop."""
        if self.run.reporter is None:
            return "go"
        return self.run.reporter.heartbeat(  # type: ignore[no-any-return]
            self.stage.name, step, self.total_steps, synced_step, wait=wait
        )

    def completions(self, exps: list[Experience], explore_step: int, step: int) -> None:
        """monitor.log_completions: a sample of explore step `explore_step`'s rollouts, seeded by it."""
        cfg = self.stage.config
        if cfg.monitor.log_completions:
            rng = random.Random(f"{cfg.seed}/{explore_step}")
            if rows := completion_rows(exps, self.tokenizer, rng, cfg.monitor.save_completions_probability):
                self.monitor.log_completions(rows, step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.monitor is not None:
            self.monitor.close()
