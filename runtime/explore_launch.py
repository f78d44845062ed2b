"""A mode-explore launch (the explorer side of a decoupled run; the mode-train launch trains):
every explore stage in order, each an ExploreLoop on the launch's rollout workers, with the links
the launch has to its run: the run's controller, which hears each step and may answer stop, and
the mode-train launch, whose end is said while the explorer waits for its weights."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ..core.config import Stage
from .explore_loop import ExploreLoop
from .launch_plan import LaunchPlan
from .paths import published_dir, stage_dir, trainer_stage_dir
from .run_lock import PeerLaunch

log = logging.getLogger("rlcore.explore")


class ExploreLaunch:
    """The links of a mode-explore launch's ExploreLoop to its run (explore_loop.RunLinks)."""

    def __init__(self, reporter: Any, trainer: PeerLaunch, max_wait_s: float):
        """`reporter`: the RunReporter to the run's controller; `trainer`: the mode-train launch,
        waited for at most `max_wait_s` (buffer.trainer_input.experience_buffer.max_wait_s)."""
        self.reporter, self.trainer, self.max_wait_s = reporter, trainer, max_wait_s

    def step_done(self, where: tuple[str, int, int, int], metrics: dict[str, float]) -> bool:
        """The step to the run's controller; whether it answers stop (after this step)."""
        stage, step, total, version = where
        self.reporter.record(stage, step, metrics)
        return bool(self.reporter.heartbeat(stage, step, total, version, wait=True) == "stop")

    def watch_trainer(self) -> None:
        """Say when the mode-train launch went (and came back): the explorer waits for it meanwhile."""
        change = self.trainer.poll(self.max_wait_s)
        if change is not None:
            log.warning("%s", change)

    def waiting(self, where: tuple[str, int, int, int]) -> bool:
        """While the explorer waits for weights: the trainer watched, and whether the run asks to
        stop (a Ctrl-C of this launch reaches the loop through its heartbeat)."""
        self.watch_trainer()
        return bool(self.reporter.heartbeat(*where, wait=False) == "stop")


def drive_explorer(stages: list[Stage], all_stages: int, plan: LaunchPlan) -> int:
    """Mode explore: every explore stage in order, on the launch's rollout workers."""
    from ..client.base import ClientOptions
    from .run_reporter import RunReporter

    base = stages[0].config
    handler = logging.StreamHandler(sys.stdout)  # what the trainer ranks log on theirs, the explorer here
    handler.setFormatter(logging.Formatter("[explorer] %(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    rlcore_log = logging.getLogger("rlcore")
    rlcore_log.addHandler(handler)
    rlcore_log.setLevel(plan.log_level)
    reporter = RunReporter(
        str(plan.run_address), ClientOptions.from_control(base.control), base.control.heartbeat_interval
    )
    try:
        for stage in stages:
            sdir = stage_dir(plan.run_dir, stage, all_stages)
            os.makedirs(sdir, exist_ok=True)
            published = published_dir(trainer_stage_dir(stage.config, stage, all_stages))
            holds = plan.worker_version if stage is stages[0] else -1
            trainer = PeerLaunch(os.path.dirname(plan.run_dir), "mode-train launch")
            launch = ExploreLaunch(reporter, trainer, stage.config.buffer.trainer_input.experience_buffer.max_wait_s)
            summary = ExploreLoop(
                stage, sdir, published, plan.rollout_endpoints, holds, launch,
                registered=reporter.rollout_workers if plan.workers_managed else None,
            ).run()
            if summary["stopped"]:
                break
    finally:
        reporter.close()
        rlcore_log.removeHandler(handler)
    return 0
