"""Mode explore: the explorer side of a decoupled run, in the launch process (the mode-train launch
trains: loop.py's buffer_step). Per step:

    load the newest weights the trainer published (waiting while they are more than
    synchronizer.max_staleness steps behind)  ->  explore the step's tasks on the rollout workers
    ->  put the groups into the experience buffer  ->  save the position  ->  log, heartbeat

The two launches share checkpoint_root_dir/project/name: the trainer's stage folders hold the
published weights (`published/`), `explorer/` holds this launch's own, and the file and sql
buffers live in `buffer/` unless configured elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any

from ..buffer import open_buffer, project_dir
from ..buffer.base import Group
from ..core.config import Stage
from ..core.data.taskset import task_stream
from ..core.step_metrics import rollout_metrics
from ..core.types import Experience
from ..rollout.explorer import Explorer, rollout_seed
from ..rollout.remote import RemoteRollout
from ..rollout.transports.base import announce
from ..rollout.transports.publish import latest_published
from .training import plan_steps

log = logging.getLogger("rlcore.explore")

PUBLISHED = "published"
STATE = "explorer_state.json"
EXPLORER_DIR = "explorer"
POLL_S = 0.5


def published_dir(trainer_stage_dir: str) -> str:
    """Where the trainer of a stage publishes its weights for the explorers."""
    return os.path.join(trainer_stage_dir, PUBLISHED)


def trainer_stage_dir(cfg: Any, stage: Stage, num_stages: int) -> str:
    """The mode-train launch's folder of `stage` (the run folder both launches share)."""
    from .loop import stage_dir

    return stage_dir(project_dir(cfg), stage, num_stages)


def wait_for_weights(folder: str, after: int, wait_s: float, what: str) -> tuple[int, str]:
    """The newest published (version, path) in `folder` once one newer than `after` is there."""
    deadline = time.monotonic() + wait_s
    while (latest := latest_published(folder)) is None or latest[0] <= after:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{what}: the trainer published no weights newer than version {after} in {folder} within "
                f"{wait_s:g} s (buffer.trainer_input.experience_buffer.max_wait_s): is the mode-train launch "
                "of this run (same checkpoint_root_dir, project and name) running?"
            )
        time.sleep(POLL_S)
    return latest


def grouped(exps: list[Experience]) -> list[Group]:
    """A step's experiences as groups (each task's, in task order)."""
    groups: dict[str, Group] = {}
    for e in exps:
        groups.setdefault(e.group_id, []).append(e)
    return list(groups.values())


class ExploreLoop:
    def __init__(self, stage: Stage, sdir: str, published: str, run: Any, holds: int = -1):
        """`holds`: the published version the workers started from (-1: none of this stage's)."""
        from ..rollout.weight_sender import WeightSender

        cfg = self.cfg = stage.config
        self.stage, self.sdir, self.folder, self.run_ctx = stage, sdir, published, run
        self.stream = task_stream(cfg)
        _, self.total_steps, train_steps = plan_steps(
            cfg, self.stream.batches_per_epoch * cfg.buffer.batch_size
        )
        self.updates_per_step = max(1, train_steps // max(1, self.total_steps))
        self.workers = RemoteRollout(cfg, run.endpoints)
        self.explorer = Explorer(cfg, self.workers)
        sc = cfg.synchronizer
        self.sender = WeightSender(
            self.workers.clients, backend="gloo", timeout_s=sc.sync_timeout, bucket_bytes=sc.bucket_mb << 20
        )  # only ever asked to have the workers load a published folder: it forms no group
        self.version = holds
        """The published version the workers hold."""
        self.served = max(c.get_info().policy_version for c in self.workers.clients)
        """The version number the workers were last given (theirs only grow: announce)."""
        self.explore_step = 0

    def run(self) -> dict[str, Any]:
        from ..core.monitor import build_monitors
        from ..core.monitor.progress import StepProgress

        cfg = self.cfg
        state_file = os.path.join(self.sdir, STATE)
        if cfg.continue_from_checkpoint and os.path.isfile(state_file):
            with open(state_file) as f:
                self.explore_step = int(json.load(f)["explore_step"])
            log.info("resumed exploring %s at step %d", self.stage.name, self.explore_step)
        eb = cfg.buffer.trainer_input.experience_buffer
        buffer = open_buffer(cfg, wait_s=eb.max_wait_s)
        monitor = build_monitors(
            list(cfg.monitor.monitor_type), self.sdir, cfg.project, f"{cfg.name}/{self.stage.name}/explorer",
            dataclasses.asdict(cfg),
        )  # fmt: skip
        progress = StepProgress(self.total_steps, desc=f"{self.stage.name} (explore)", file=sys.stdout)
        stopped = False
        try:
            print(f"rlcore: exploring {self.stage.name} into {buffer.describe()}", flush=True)
            while self.explore_step < self.total_steps:
                start = time.perf_counter()
                metrics = self._follow_trainer()
                exps = self._explore()
                groups = grouped(exps)
                buffer.put(groups)
                self.explore_step += 1
                _write_json(state_file, {"explore_step": self.explore_step, "policy_version": self.version})
                metrics.update(rollout_metrics(exps))
                metrics.update(self.explorer.report())
                metrics["rollout/policy_version"] = float(self.version)
                metrics["buffer/groups_put"] = float(len(groups))
                metrics["buffer/experiences_put"] = float(len(exps))
                metrics["perf/step_time_s"] = time.perf_counter() - start
                monitor.log(metrics, self.explore_step)
                progress.update(self.explore_step, metrics)
                reporter = self.run_ctx.reporter
                if reporter is not None:
                    reporter.record(self.stage.name, self.explore_step, metrics)
                    if (
                        reporter.heartbeat(
                            self.stage.name, self.explore_step, self.total_steps, self.version, wait=True
                        )
                        == "stop"
                    ):
                        stopped = True
                        break
            if not stopped:
                buffer.finish()  # the trainer ends once it has read the rest
        finally:
            progress.close()
            monitor.close()
            buffer.close()
            self.sender.close()
            self.workers.close()
        return {"stage": self.stage.name, "explore_step": self.explore_step, "stopped": stopped}

    def _follow_trainer(self) -> dict[str, float]:
        """Load the newest published weights; while they are more than max_staleness steps behind
        the step about to be explored, wait for newer ones."""
        bound = self.cfg.synchronizer.max_staleness
        need = -1 if bound is None else (self.explore_step - bound) * self.updates_per_step
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        wait_s = self.cfg.buffer.trainer_input.experience_buffer.max_wait_s
        latest = latest_published(self.folder)
        if latest is None or latest[0] < max(need, 0):
            latest = wait_for_weights(
                self.folder,
                max(need, 0) - 1,
                wait_s,
                f"explore step {self.explore_step} of {self.stage.name}",
            )
            metrics["perf/wait_for_weights_s"] = time.perf_counter() - start
        version, path = latest
        if version > self.version:
            self.served = announce(version, self.served)
            stats = self.sender.send_checkpoint(path, self.served)
            self.version = version
            metrics["perf/load_weights_s"] = stats.get("total_s", 0.0)
            log.info("the rollout workers hold version %d (%s)", version, path)
        return metrics

    def _explore(self) -> list[Experience]:
        tasks = self.stream.batch(self.explore_step)
        exps = self.explorer.explore(tasks, seed=rollout_seed(self.cfg.seed, self.explore_step))
        for e in exps:
            e.policy_version = self.version
        return exps


def _write_json(path: str, value: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def drive_explorer(stages: list[Stage], all_stages: int, plan: dict[str, Any]) -> int:
    """Mode explore: every explore stage in order, on the launch's rollout workers."""
    from ..client.base import ClientOptions
    from .loop import RunContext, stage_dir
    from .run_reporter import RunReporter

    base = stages[0].config
    reporter = RunReporter(
        plan["run_address"], ClientOptions.from_control(base.control), base.control.heartbeat_interval
    )
    try:
        run = RunContext(plan["run_dir"], plan["device"], plan["rollout_endpoints"], reporter)
        for stage in stages:
            sdir = stage_dir(plan["run_dir"], stage, all_stages)
            os.makedirs(sdir, exist_ok=True)
            published = published_dir(trainer_stage_dir(stage.config, stage, all_stages))
            holds = plan["worker_version"] if stage is stages[0] else -1
            summary = ExploreLoop(stage, sdir, published, run, holds).run()
            if summary["stopped"]:
                break
    finally:
        reporter.close()
    return 0
