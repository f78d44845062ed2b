"""Rollouts explored in lock-step on the stage's engines (plan.source rollouts, modes both and
colocate): each step explores its tasks with the weights the engines hold, between syncs.

    take      [sync if the engines are too stale (explorer_driven)]  the step's rollout, or the one
              started ahead  ->  into the task history (task_selection)  ->  drop what is too stale
              ->  [refill: dynamic sampling]
    ahead     synchronizer.rollout_ahead: the next step's rollout starts before this one trains
              (`start_ahead`), and `wait` lets the sync, evaluation and checkpoint find the engines idle
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.algorithms import algorithm_of
from ..core.config import RLCoreConfig
from ..core.config.plan import StagePlan
from ..core.data.task_selection import SelectingStream
from ..core.data.taskset import MixtureStream, TaskStream
from ..core.types import Experience
from ..weights.schedule import SyncSchedule
from .engine_link import EngineLink
from .rollout_ahead import RolloutAhead


class LockstepSource:
    def __init__(
        self, cfg: RLCoreConfig, plan: StagePlan, link: EngineLink, stream: TaskStream | SelectingStream | MixtureStream, schedule: SyncSchedule,
    ):  # fmt: skip
        self.cfg, self.plan, self.link, self.stream, self.schedule = cfg, plan, link, stream, schedule
        self.ahead = RolloutAhead(bool(cfg.synchronizer.rollout_ahead) and link.explorer is not None)
        self.selection = stream.selection
        """The task history, filter and curriculum (buffer.explorer_input.task_selection); None: off."""
        self.next_step = 0
        """The explore step the next take explores (where a checkpoint's task selection stands)."""

    def take(
        self, explore_step: int, step: int, mixture: Callable[[list[Experience]], dict[str, float]]
    ) -> tuple[list[Experience], dict[str, float]]:
        """Explore step `explore_step`'s experiences for optimizer step `step`, and their metrics
        (with `mixture`'s per-taskset ones)."""
        link = self.link
        metrics = link.follow_workers(step)
        if self.schedule.due_before_explore(step, link.synced_step):
            metrics.update(link.sync(step))
        start = time.perf_counter()
        taken = self.ahead.take(explore_step)  # generated during the previous step, by older weights
        (exps, report), version = taken or (
            link.explore_now(self.stream.batch(explore_step), explore_step, step), link.synced_step
        )
        self._record(exps, explore_step)
        exps = self.schedule.drop_stale(exps, [version] * len(exps), step, metrics)
        if self.plan.passes.refill:  # e.g. DAPO's dynamic sampling: refill the groups that teach nothing
            algo = self.cfg.algorithm

            def extra_round(r: int) -> list[Experience]:
                return self._record(link.explore(self.stream.extra(explore_step, r), explore_step, r)[0], explore_step)

            exps = algorithm_of(algo).refill(algo, exps, self.cfg.buffer.batch_size, extra_round, metrics)
        if self.selection is not None:
            metrics.update(self.selection.metrics(explore_step))
        self.next_step = explore_step + 1
        metrics.update(mixture(exps))
        metrics["perf/generate_s"] = time.perf_counter() - start
        metrics.update(report)
        metrics["rollout/generated_ahead"] = float(taken is not None)
        return exps, metrics

    def start_ahead(self, following: int, last: bool) -> None:
        """synchronizer.rollout_ahead: start explore step `following`'s rollout, unless this step is
        the stage's `last`."""
        if not self.ahead.enabled or last:
            return
        tasks = self.stream.batch(following)
        self.ahead.start(following, lambda: self.link.explore(tasks, following), version=self.link.synced_step)

    def _record(self, exps: list[Experience], explore_step: int) -> list[Experience]:
        if self.selection is not None:
            self.selection.record(exps, explore_step)
        return exps

    def state_dict(self) -> dict[str, Any] | None:
        """The task selection's state for a checkpoint (None: no selection, nothing to keep)."""
        if self.selection is None:
            return None
        return {"task_selection": self.selection.state_dict(self.next_step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """What `state_dict` returned, as a checkpoint kept it; explore step `next_step` comes next."""
        assert self.selection is not None
        self.selection.load_state_dict(state["task_selection"])

    def wait(self) -> dict[str, float]:
        return self.ahead.wait()

    def close(self) -> None:
        self.ahead.close()
