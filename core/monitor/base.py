"""The monitor interface: where per-step metrics go (files, dashboards, the terminal)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Monitor(ABC):
    """A metrics sink. Only rank 0 logs; `log` is called once per step with flat `section/name` keys."""

    @classmethod
    def from_run(cls, run_dir: str, project: str, name: str, config: dict[str, Any]) -> Monitor:
        """Build from what every run knows (`build_monitors` uses this); most sinks need only the folder."""
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
