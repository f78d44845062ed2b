"""The explorer's steps: a decoupled run's explorer side, in a mode-explore launch's process
(explore_launch.py; the mode-train launch trains on what it puts) or in a thread of an asynchronous
`both` stage (buffer_source.py). Per step:

    load the newest weights the trainer published (waiting while they are more than
    synchronizer.max_staleness versions behind)  ->  explore the step's tasks on the rollout workers
    ->  put the groups into the experience buffer  ->  save the position  ->  log, heartbeat

With explorer.over_rollout or explorer.dynamic_timeout the step's tasks go one by one through the
task scheduler (rollout/scheduler.py): a step puts what finished, and tasks left running feed the
next step.

The two launches share checkpoint_root_dir/project/name: the trainer's stage folders hold the
published weights (`published/`), `explorer/` holds this launch's own, and the file and sql
buffers live in `buffer/` unless configured elsewhere.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..buffer import open_buffer
from ..buffer.base import Group
from ..core.algorithms import algorithm_of
from ..core.algorithms.dpo import best_and_worst
from ..core.config import Stage
from ..core.data.taskset import task_stream
from ..core.step_metrics import rollout_metrics
from ..core.types import Experience, skipped_task
from ..rollout.explorer import Explorer, rollout_seed
from ..rollout.pool import WorkerPool
from ..rollout.remote import NoWorkerAnswers, WorkersPaused
from ..rollout.scheduler import TaskScheduler
from ..weights.follower import WeightsFollower
from ..weights.schedule import SyncSchedule
from .explore_position import ExplorePosition
from .step_sizes import plan_steps

log = logging.getLogger("rlcore.explore")

STATE = "explorer_state.json"


class RunLinks(Protocol):
    """What a mode-explore launch links its ExploreLoop to (explore_launch.ExploreLaunch): where
    is (stage, explore step, total steps, policy version held)."""

    def step_done(self, where: tuple[str, int, int, int], metrics: dict[str, float]) -> bool: ...

    def watch_trainer(self) -> None: ...

    def waiting(self, where: tuple[str, int, int, int]) -> bool: ...


def grouped(exps: list[Experience]) -> list[Group]:
    """A step's experiences as groups (each task's, in task order)."""
    groups: dict[str, Group] = {}
    for e in exps:
        groups.setdefault(e.group_id, []).append(e)
    return list(groups.values())


class ExploreLoop:
    """The explorer's steps (`run`): of a mode-explore launch, or of the thread of an asynchronous
    `both` stage, which hands it the buffer, the step to start at and the lock; `stop` ends it."""

    def __init__(
        self, stage: Stage, sdir: str, published: str, endpoints: list[str], holds: int = -1,
        launch: RunLinks | None = None, buffer: Any = None, start_step: int | None = None,
        resume_from: dict[str, Any] | None = None, registered: Callable[[], list[str] | None] | None = None,
        lock: threading.Lock | None = None,
    ):  # fmt: skip
        """`holds`: the published version the workers started from (-1: none of this stage's);
        `launch`: a mode-explore launch's links to its run (none in an explorer thread);
        `resume_from`: a failed loop's `saved` position (explorer_thread.py restarts it from there),
        or the one a checkpoint kept; `registered()`: the launch's rollout workers as the run lists
        them now (workers it restarts come back at new addresses), None where it does not manage them;
        `lock`: held while a step's groups go into the buffer and its position is saved, so that a
        checkpoint's snapshot (buffer_source.py) sees both or neither."""
        from ..core.rpc.security import read_token

        cfg = self.cfg = stage.config
        self.stage, self.sdir, self.launch = stage, sdir, launch
        self.stream = task_stream(cfg)
        _, self.total_steps, train_steps = plan_steps(cfg, self.stream.batches_per_epoch * cfg.buffer.batch_size)
        self.updates_per_step = max(1, train_steps // max(1, self.total_steps))
        self.pool = WorkerPool(cfg, endpoints, registered)
        self.workers = self.pool.rollout
        self.explorer = Explorer(cfg, self.workers)
        self.scheduler = TaskScheduler(cfg, self.workers) if stage.plan.schedules_tasks else None
        """Tasks one by one (over-rollout, dynamic timeout); None: a step's batch at once."""
        by_group = stage.plan.explorer_weights == "nccl"
        token = (read_token(cfg.control.token_env) or "") if by_group else ""
        self.weights = WeightsFollower(published, cfg.synchronizer, self.workers.clients, holds, by_group, token)
        self.given_buffer = buffer
        self.position = ExplorePosition(os.path.join(sdir, STATE), start_step or 0, stage.name, self.stream.selection)
        self.resumes = start_step is None and cfg.continue_from_checkpoint
        self.dropped = 0
        """Tasks the scheduler left out so far."""
        self.drawn = 0
        """Tasks the last explore step drew."""
        self.stop = threading.Event()
        self.lock = lock or threading.Lock()
        if resume_from is not None:
            self.position.restore(resume_from)

    @property
    def explore_step(self) -> int:
        return self.position.step

    @property
    def saved(self) -> dict[str, Any] | None:
        """The position written after the last step (explore step, running tasks, groups put)."""
        return self.position.saved

    # ------------------------------------------------------------------ the steps

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        eb = cfg.buffer.trainer_input.experience_buffer
        buffer = self.given_buffer or open_buffer(cfg, wait_s=eb.max_wait_s)
        if self.resumes:
            self.position.resume(buffer)
        self.position.check_buffer(buffer)
        monitor, progress = _display(self.stage, self.sdir, self.total_steps, own=self.given_buffer is None)
        try:
            log.info("exploring %s into %s", self.stage.name, buffer.describe())
            while self.explore_step < self.total_steps and not self.stop.is_set():
                metrics = self._step(buffer)
                if metrics is None:  # stopped while it waited for weights
                    break
                monitor.log(metrics, self.explore_step)
                if progress is not None:
                    progress.update(self.explore_step, metrics)
                if self.launch is not None and self.launch.step_done(self._where(), metrics):
                    self.stop.set()  # the run asks to stop: after this step
            if self.dropped:
                log.warning(
                    "%d task(s) of %s were left out after explorer.max_retry_times retries: the trainer gets "
                    "that many fewer groups (and may train fewer steps)", self.dropped, self.stage.name,
                )  # fmt: skip
            if not self.stop.is_set():
                buffer.finish()  # the trainer ends once it has read the rest
        finally:
            if progress is not None:
                progress.close()
            monitor.close()
            if self.given_buffer is None:
                buffer.close()
            if self.scheduler is not None:
                self.scheduler.close()
            self.weights.close()
            self.pool.close()
        return {"stage": self.stage.name, "explore_step": self.explore_step, "stopped": self.stop.is_set()}

    def _step(self, buffer: Any) -> dict[str, float] | None:
        """One explore step: the newest weights, the step's groups into the buffer, the position
        saved; its metrics (None: stopped while waiting for weights)."""
        start = time.perf_counter()
        self._follow_workers()
        try:
            metrics = self._follow_trainer()
            if self.stop.is_set():
                return None
            exps, explored = self._explore()
            if self.stage.plan.passes.refill:  # dynamic sampling: the groups that teach nothing stay out of the buffer
                exps = self._refill(exps, explored)
        except WorkersPaused as e:
            if not self._wait_for_unpause(e):
                return None
            return self._step(buffer)  # the step again, on workers that hold newer weights
        except NoWorkerAnswers:
            if not self._wait_for_restarts():
                raise
            return self._step(buffer)  # the step again, on the restarted workers
        metrics.update(explored)
        self.dropped += int(explored.get("rollout/tasks_dropped", 0))
        if self.stream.selection is not None:
            metrics.update(self.stream.selection.metrics(self.explore_step))
        groups = grouped(exps)
        if self.stage.plan.trains_on == "pairs":  # DPO's (algorithm.dpo.pairs buffer): a pair per task
            pairs = [p for p in map(best_and_worst, groups) if p is not None]
            metrics["buffer/groups_tied"] = float(len(groups) - len(pairs))
            groups = pairs
        places = self._skipped_places()
        running = self.scheduler.running_tasks() if self.scheduler is not None else None
        self.position.record(buffer, groups + places, running, self.weights.version, self.lock)
        if not groups:
            log.warning("explore step %d: every task was left out (or tied); nothing put", self.explore_step - 1)
        if exps:
            metrics.update(rollout_metrics(exps))
        metrics.update(self.explorer.report())
        metrics["rollout/policy_version"] = float(self.weights.version)
        metrics["buffer/groups_put"] = float(len(groups))
        metrics["buffer/experiences_put"] = float(sum(len(g) for g in groups))
        if places:
            metrics["buffer/skipped_places_put"] = float(len(places))
        metrics["perf/step_time_s"] = time.perf_counter() - start
        return metrics

    def _skipped_places(self) -> list[list[Experience]]:
        """Without refill (task_selection.difficulty_filter.refill false), a place in the buffer for
        each task the filter skipped this step, so that the step fills batch_size places and the
        trainer's step, which takes batch_size of them, trains on this step's open tasks only, as a
        lock-step step does (core/types.skipped_task); none otherwise."""
        selection = self.stream.selection
        if selection is None or selection.cfg.difficulty_filter.refill or not selection.cfg.difficulty_filter.enable:
            return []
        stage = self.stage.name
        return [
            skipped_task(f"{stage}:skipped:{self.explore_step}:{k}", self.weights.version)
            for k in range(max(0, self.cfg.buffer.batch_size - self.drawn))
        ]

    def _where(self) -> tuple[str, int, int, int]:
        """(stage, explore step, total steps, policy version held), for the run's controller."""
        return self.stage.name, self.explore_step, self.total_steps, self.weights.version

    def _follow_trainer(self) -> dict[str, float]:
        """Load the newest published weights; while they are more than max_staleness policy versions
        behind the step about to be explored, wait for newer ones (until the stop event). Explore step
        e is trained on from optimizer step e x (optimizer steps per explore step) on: its weights may
        be up to max_staleness versions older than that, the unit the trainer drops in."""
        position = self.explore_step
        if self.stage.plan.trains_on == "pairs" or self.stage.plan.passes.refill:
            # tied groups give no pair, dynamic sampling may put fewer groups than a batch: the
            # position is the trainer's step that reads next
            position = sum(self.position.put.values()) // self.cfg.buffer.batch_size
        need = SyncSchedule(self.cfg.synchronizer).oldest_for_explore(position, self.updates_per_step)
        if self.launch is not None:
            self.launch.watch_trainer()  # every step: it is seen alive, so that its end is noticed
        wait_s = self.cfg.buffer.trainer_input.experience_buffer.max_wait_s
        what = f"explore step {self.explore_step} of {self.stage.name}"
        return self.weights.follow(need, wait_s, what, self.stop, self._waiting, self._load) or {}

    def _load(self, path: str) -> dict[str, float]:
        """Have the workers load a published folder; a worker that died meanwhile (here, or in a
        rollout that dropped it) is left out (the launch restarts it and the pool takes it back) and
        the others load it."""
        if self.weights.clients != self.workers.clients:  # a rollout dropped a worker that stopped answering
            self.weights.workers_changed(self.workers.clients, joined=False)
        try:
            return self.weights.load(path)
        except Exception:
            gone = self.pool.leave_out_silent()
            if not gone:
                raise
            if not self.workers.clients:
                raise NoWorkerAnswers(f"no rollout worker answers: {', '.join(gone)} stopped") from None
            log.warning("rollout worker(s) %s stopped answering; the others load %s", ", ".join(gone), path)
            self.weights.workers_changed(self.workers.clients, joined=False)
            return self.weights.load(path, again=True)  # some took the version number already

    def _follow_workers(self) -> None:
        """The launch's rollout workers as the run lists them now (rollout/pool.py); those it
        restarted get the newest published weights, with the others, before any task."""
        if self.pool.follow():
            self.weights.workers_changed(self.workers.clients, joined=bool(self.pool.joined))

    def _wait_for_restarts(self) -> bool:
        """Every rollout worker stopped answering mid-step: wait for the launch to list restarted
        ones; False where it does not restart them, with the task scheduler (tasks in flight on the
        dead workers: the explorer thread restarts the loop from its position instead), or when none
        came: the step then fails."""
        if not self.pool.managed or self.scheduler is not None:
            return False
        then = f", then exploring step {self.explore_step} again"
        if not self.pool.await_restarted(self.stop, then):
            return False
        self._follow_workers()
        return bool(self.workers.clients)

    def _wait_for_unpause(self, paused: WorkersPaused) -> bool:
        """The workers answer but a weight update holds them paused: one running now, or one whose
        sender died part way (a trainer killed mid-push), which holds them until its next update.
        Wait for that (watching the trainer meanwhile, as any wait for weights does); False when
        the run stopped first."""
        log.warning("explore step %d: %s; waiting for it to end, then exploring the step again", self.explore_step, paused)
        wait_s = self.cfg.buffer.trainer_input.experience_buffer.max_wait_s
        what = f"explore step {self.explore_step} of {self.stage.name}"
        return self.weights.await_unpaused(wait_s, what, self.stop, self._waiting)

    def _waiting(self) -> bool:
        """While waiting for weights: True (stop) when the run asks to stop (a Ctrl-C of this launch
        reaches the loop through its heartbeat)."""
        if self.launch is not None and self.launch.waiting(self._where()):
            self.stop.set()
        return self.stop.is_set()

    def _explore(self) -> tuple[list[Experience], dict[str, float]]:
        """The step's experiences (with the task scheduler: every task finished since the last
        step, whichever step sent it) and the scheduler's metrics."""
        tasks, self.position.resend = self.position.resend + self.stream.batch(self.explore_step), []
        self.drawn = len(tasks)
        seed = rollout_seed(self.cfg.seed, self.explore_step)
        if self.scheduler is not None:
            self.scheduler.submit(self.explorer.plan(tasks, seed), self.weights.version)
            exps, metrics = self.scheduler.collect(len(tasks), everything=self.explore_step + 1 == self.total_steps)
            if self.stream.selection is not None:
                self.stream.selection.record(exps, self.explore_step)
            return exps, metrics
        return self._explored(self.explorer.explore(tasks, seed)), {}

    def _explored(self, exps: list[Experience]) -> list[Experience]:
        """Rollouts of this step, with the version of the weights that generated them, into the task history."""
        for e in exps:
            e.policy_version = self.weights.version
        if self.stream.selection is not None:
            self.stream.selection.record(exps, self.explore_step)
        return exps

    def _refill(self, exps: list[Experience], metrics: dict[str, float]) -> list[Experience]:
        """The step's groups whose rewards differ, refilled to buffer.batch_size groups by the
        algorithm's extra rounds (dynamic sampling); with the task scheduler, whose steps hold what
        finished, those groups only (its next steps bring more)."""
        algo, step = self.cfg.algorithm, self.explore_step

        def extra_round(r: int) -> list[Experience]:
            return self._explored(self.explorer.explore(self.stream.extra(step, r), rollout_seed(self.cfg.seed, step, r)))

        want = 0 if self.scheduler is not None else self.cfg.buffer.batch_size
        return algorithm_of(algo).refill(algo, exps, want, extra_round, metrics)


def _display(stage: Stage, sdir: str, total_steps: int, own: bool) -> tuple[Any, Any]:
    """(monitor, progress bar or None) of an explorer's steps: a launch's (`own`) are logged to the
    configured trackers under a bar of their own; a thread's to metrics.jsonl only (its progress
    is the trainer's bar)."""
    from ..core.monitor import build_monitors
    from ..core.monitor.progress import StepProgress

    cfg = stage.config
    os.makedirs(sdir, exist_ok=True)
    monitor = build_monitors(
        list(cfg.monitor.monitor_type) if own else ["jsonl"], sdir, cfg.project,
        f"{cfg.name}/{stage.name}/explorer", dataclasses.asdict(cfg),
    )  # fmt: skip
    progress = StepProgress(total_steps, desc=f"{stage.name} (explore)", file=sys.stdout) if own else None
    return monitor, progress
