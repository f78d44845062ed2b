"""The monitor interface: where per-step metrics go (files, dashboards, the terminal)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

from ..rpc.cli import write_atomic


class Monitor(ABC):
    """A metrics sink. Only rank 0 logs; `log` is called once per step with flat `section/name` keys."""

    @classmethod
    def from_run(
        cls, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ) -> Monitor:
        """Build from what every run knows (`build_monitors` uses this). `resumed_at`: the step a
        resumed run takes up from (continue_from_checkpoint; 0 when its stage starts over): the steps
        after it are logged again, so a sink that keeps earlier launches' records drops or hides what
        it holds past that step, and each step's values are there once, the last ones logged."""
        return cls(run_dir)  # type: ignore[call-arg]

    @abstractmethod
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """A sample of a step's rollouts (monitor.log_completions), one dict per rollout: prompt,
        response, reward, rewards, finish_reason, group, policy_version, counts. Sinks without a
        place for text ignore them."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Flush and release files or remote runs; called once at the end of the run."""


class MultiMonitor(Monitor):
    """Fans every call out to several monitors, in the order they were configured."""

    def __init__(self, monitors: list[Monitor]):
        self.monitors = monitors

    def log(self, metrics: dict[str, float], step: int) -> None:
        for monitor in self.monitors:
            monitor.log(metrics, step)

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        for monitor in self.monitors:
            monitor.log_completions(rows, step)

    def close(self) -> None:
        for monitor in self.monitors:
            monitor.close()


def remembered_id(run_dir: str, file_name: str) -> str | None:
    """The id of a tracker's run kept in `run_dir/file_name` by an earlier launch of this run (a
    resumed run continues that tracker run), None for a new one."""
    path = os.path.join(run_dir, file_name)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip() or None


def remember_id(run_dir: str, file_name: str, run_id: str) -> None:
    os.makedirs(run_dir, exist_ok=True)
    write_atomic(os.path.join(run_dir, file_name), run_id)
