"""Rollouts explored in lock-step on the stage's engines (plan.source rollouts, modes both and
colocate): each step explores its tasks with the weights the engines hold, between syncs.

    take      [sync if the engines are too stale (explorer_driven)]  the step's rollout, or the one
              started ahead  ->  drop what is too stale  ->  [refill: dynamic sampling]
    ahead     synchronizer.rollout_ahead: the next step's rollout starts before this one trains
              (`start_ahead`), and `wait` lets the sync, evaluation and checkpoint find the engines idle
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..core.algorithms import algorithm_of
from ..core.config import RLCoreConfig
from ..core.config.plan import StagePlan
from ..core.data.taskset import MixtureStream, TaskStream
from ..core.types import Experience
from ..weights.schedule import SyncSchedule
from .engine_link import EngineLink
from .rollout_ahead import RolloutAhead


class LockstepSource:
    def __init__(
        self, cfg: RLCoreConfig, plan: StagePlan, link: EngineLink, stream: TaskStream | MixtureStream, schedule: SyncSchedule,
    ):  # fmt: skip
        self.cfg, self.plan, self.link, self.stream, self.schedule = cfg, plan, link, stream, schedule
        self.ahead = RolloutAhead(bool(cfg.synchronizer.rollout_ahead) and link.explorer is not None)

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
        exps = self.schedule.drop_stale(exps, [version] * len(exps), step, metrics)
        if self.plan.passes.refill:  # e.g. DAPO's dynamic sampling: refill the groups that teach nothing
            algo = self.cfg.algorithm
            exps = algorithm_of(algo).refill(
                algo, exps, self.cfg.buffer.batch_size,
                lambda r: link.explore(self.stream.extra(explore_step, r), explore_step, r)[0], metrics,
            )  # fmt: skip
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

    def wait(self) -> dict[str, float]:
        return self.ahead.wait()

    def close(self) -> None:
        self.ahead.close()
