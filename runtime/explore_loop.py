"""Mode explore: the explorer side of a decoupled run, in the launch process (the mode-train launch
trains: loop.py's buffer_step). Per step:

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
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..buffer import open_buffer
from ..buffer.base import Group
from ..core.algorithms.dpo import best_and_worst
from ..core.config import Stage
from ..core.data.taskset import task_stream
from ..core.step_metrics import rollout_metrics
from ..core.types import Experience, Task
from ..rollout.explorer import Explorer, rollout_seed
from ..rollout.remote import NoWorkerAnswers, RemoteRollout
from ..rollout.scheduler import TaskScheduler
from ..weights.base import announce
from ..weights.publish import last_push, latest_published, register_receivers, unregister_receivers
from ..weights.schedule import SyncSchedule
from .explore_position import begin_put, check_buffer_holds, end_put, resume_position, save_position
from .paths import published_dir, stage_dir, trainer_stage_dir
from .run_lock import PeerLaunch
from .step_sizes import plan_steps

log = logging.getLogger("rlcore.explore")

STATE = "explorer_state.json"
CHECK_S = 1.0
"""How often an explorer waiting for weights asks whether the run stops and the trainer launch lives."""
POLL_S = 0.5


def wait_for_weights(
    folder: str, after: int, wait_s: float, what: str, stop: threading.Event | None = None,
    check: Callable[[], bool] | None = None, newest: Callable[[], tuple[int, str] | None] | None = None,
) -> tuple[int, str] | None:  # fmt: skip
    """The newest published (version, path) in `folder` once one newer than `after` is there;
    None when `stop` is set first. `check`, called at once and then about once a second, returns
    True when the run asks to stop (then None too). `newest()`: what is newest instead of the
    folder's latest version (path "" for weights the workers already hold)."""
    deadline = time.monotonic() + wait_s
    checked = -CHECK_S  # at once, then about once a second
    look = newest or (lambda: latest_published(folder))
    while (latest := look()) is None or latest[0] <= after:
        if check is not None and time.monotonic() - checked >= CHECK_S:
            checked = time.monotonic()
            if check():
                return None
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{what}: the trainer published no weights newer than version {after} in {folder} within "
                f"{wait_s:g} s (buffer.trainer_input.experience_buffer.max_wait_s): is the mode-train launch "
                "of this run (same checkpoint_root_dir, project and name) running?"
            )
        if stop is not None and stop.wait(POLL_S):
            return None
        if stop is None:
            time.sleep(POLL_S)
    return latest


def grouped(exps: list[Experience]) -> list[Group]:
    """A step's experiences as groups (each task's, in task order)."""
    groups: dict[str, Group] = {}
    for e in exps:
        groups.setdefault(e.group_id, []).append(e)
    return list(groups.values())


class ExploreLoop:
    """The explorer's steps. Run by a mode-explore launch (`run`), or in a thread of an asynchronous
    `both` stage (`start`), which hands it the buffer, the step to start at and a stop event."""

    def __init__(
        self, stage: Stage, sdir: str, published: str, endpoints: list[str], holds: int = -1,
        reporter: Any = None, buffer: Any = None, start_step: int | None = None, trainer: PeerLaunch | None = None,
        resume_from: dict[str, Any] | None = None, registered: Callable[[], list[str] | None] | None = None,
        lock: threading.Lock | None = None,
    ):  # fmt: skip
        """`holds`: the published version the workers started from (-1: none of this stage's);
        `resume_from`: a failed loop's `saved` position (explorer_thread.py restarts it from there),
        or the one a checkpoint kept; `registered()`: the launch's rollout workers as the run lists
        them now (workers it restarts come back at new addresses), None where it does not manage them;
        `lock`: held while a step's groups go into the buffer and its position is saved, so that a
        checkpoint's snapshot (buffer_source.py) sees both or neither."""
        from ..weights.sender import connect

        cfg = self.cfg = stage.config
        self.stage, self.sdir, self.folder, self.reporter = stage, sdir, published, reporter
        self.trainer = trainer
        """The mode-train launch (mode explore): watched, and its end said, while waiting for its weights."""
        self.stream = task_stream(cfg)
        _, self.total_steps, train_steps = plan_steps(cfg, self.stream.batches_per_epoch * cfg.buffer.batch_size)
        self.updates_per_step = max(1, train_steps // max(1, self.total_steps))
        self.workers = RemoteRollout(cfg, endpoints)
        self.explorer = Explorer(cfg, self.workers)
        self.scheduler = TaskScheduler(cfg, self.workers) if stage.plan.schedules_tasks else None
        """Tasks one by one (over-rollout, dynamic timeout); None: a step's batch at once."""
        # only ever asked to have the workers load a published folder: it forms no group
        self.sender = connect(self.workers.clients, cfg.synchronizer)
        self.version = holds
        """The published version the workers hold."""
        self.by_group = stage.plan.explorer_weights == "nccl"
        """The trainer pushes its versions to the workers registered in the folder (else: folders only)."""
        self.registered_workers: list[str] | None = None
        self.registered = registered
        self.served = max(c.get_info().policy_version for c in self.workers.clients)
        """The version number the workers were last given (theirs only grow: announce)."""
        self.given_buffer = buffer
        self.explore_step = 0 if start_step is None else start_step
        self.resumes = start_step is None and cfg.continue_from_checkpoint
        self.resend: list[Task] = []
        """Tasks that were still running when the explorer last stopped (its state keeps them)."""
        self.put: dict[str, int] = {}
        """Groups put per buffer writer id, this explorer's earlier launches included (its state
        keeps them): a resumed explorer checks that the buffer still holds them."""
        self.dropped = 0
        """Tasks the scheduler left out so far."""
        self.saved: dict[str, Any] | None = None
        """The position written after the last step (explore step, running tasks, groups put)."""
        self.stop = threading.Event()
        self.lock = lock or threading.Lock()
        if resume_from is not None:
            self._restore(resume_from)

    # ------------------------------------------------------------------ the steps

    def run(self) -> dict[str, Any]:
        from ..core.monitor import build_monitors
        from ..core.monitor.progress import StepProgress

        cfg = self.cfg
        state_file = os.path.join(self.sdir, STATE)
        eb = cfg.buffer.trainer_input.experience_buffer
        buffer = self.given_buffer or open_buffer(cfg, wait_s=eb.max_wait_s)
        if self.resumes:
            self._resume(state_file, buffer)
        check_buffer_holds(buffer, self.put, state_file)
        os.makedirs(self.sdir, exist_ok=True)
        monitor = build_monitors(
            list(cfg.monitor.monitor_type) if self.given_buffer is None else ["jsonl"], self.sdir, cfg.project,
            f"{cfg.name}/{self.stage.name}/explorer", dataclasses.asdict(cfg),
        )  # fmt: skip
        progress = (  # a thread's progress is the trainer's bar
            StepProgress(self.total_steps, desc=f"{self.stage.name} (explore)", file=sys.stdout)
            if self.given_buffer is None
            else None
        )
        try:
            log.info("exploring %s into %s", self.stage.name, buffer.describe())
            while self.explore_step < self.total_steps and not self.stop.is_set():
                metrics = self._step(buffer, state_file)
                if metrics is None:  # stopped while it waited for weights
                    break
                monitor.log(metrics, self.explore_step)
                if progress is not None:
                    progress.update(self.explore_step, metrics)
                self._report(metrics)
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
            self.sender.close()
            self.workers.close()
            if self.registered_workers is not None:  # the trainer publishes folders again
                unregister_receivers(self.folder)
        return {"stage": self.stage.name, "explore_step": self.explore_step, "stopped": self.stop.is_set()}

    def _resume(self, state_file: str, buffer: Any) -> None:
        saved = None
        if os.path.isfile(state_file):
            with open(state_file) as f:
                saved = json.load(f)
        if (position := resume_position(buffer, saved, state_file)) is not None:
            self._restore(position)

    def _restore(self, saved: dict[str, Any]) -> None:
        self.explore_step = int(saved["explore_step"])
        self.resend = [Task(**t) for t in saved.get("running", [])]
        self.put = {str(w): int(n) for w, n in saved.get("put", {}).items()}
        log.info(
            "resumed exploring %s at step %d%s", self.stage.name, self.explore_step,
            f" ({len(self.resend)} task(s) that were still running are sent again)" if self.resend else "",
        )  # fmt: skip

    def _step(self, buffer: Any, state_file: str) -> dict[str, float] | None:
        """One explore step: the newest weights, the step's groups into the buffer, the position
        saved; its metrics (None: stopped while waiting for weights)."""
        start = time.perf_counter()
        self._follow_workers()
        try:
            metrics = self._follow_trainer()
            if self.stop.is_set():
                return None
            exps, explored = self._explore()
        except NoWorkerAnswers:
            if not self._wait_for_restarts():
                raise
            return self._step(buffer, state_file)  # the step again, on the restarted workers
        metrics.update(explored)
        self.dropped += int(explored.get("rollout/tasks_dropped", 0))
        groups = grouped(exps)
        if self.stage.plan.trains_on == "pairs":  # DPO's (algorithm.dpo_pairs buffer): a pair per task
            pairs = [p for p in map(best_and_worst, groups) if p is not None]
            metrics["buffer/groups_tied"] = float(len(groups) - len(pairs))
            groups = pairs
        state: dict[str, Any] = {"explore_step": self.explore_step + 1, "policy_version": self.version}
        if self.scheduler is not None:  # tasks left running: a resumed explorer sends them again
            state["running"] = [dataclasses.asdict(t) for t in self.scheduler.running_tasks()]
        state["put"] = dict(self.put)
        if groups:
            state["put"][buffer.writer] = self.put.get(buffer.writer, 0) + len(groups)
        with self.lock:
            if groups:
                begin_put(state_file, state)  # a resumed explorer asks the buffer whether the put landed
                buffer.put(groups)
            self.put, self.saved = dict(state["put"]), state
            self.explore_step += 1
            save_position(state_file, state)
            if groups:
                end_put(state_file)
        if not groups:
            log.warning("explore step %d: every task was left out (or tied); nothing put", self.explore_step - 1)
        metrics.update(rollout_metrics(exps))
        metrics.update(self.explorer.report())
        metrics["rollout/policy_version"] = float(self.version)
        metrics["buffer/groups_put"] = float(len(groups))
        metrics["buffer/experiences_put"] = float(sum(len(g) for g in groups))
        metrics["perf/step_time_s"] = time.perf_counter() - start
        return metrics

    def _report(self, metrics: dict[str, float]) -> None:
        """The step to the run's controller; its answer 'stop' stops the explorer after this step."""
        if self.reporter is None:
            return
        self.reporter.record(self.stage.name, self.explore_step, metrics)
        answer = self.reporter.heartbeat(self.stage.name, self.explore_step, self.total_steps, self.version, wait=True)
        if answer == "stop":
            self.stop.set()

    def _follow_trainer(self) -> dict[str, float]:
        """Load the newest published weights; while they are more than max_staleness policy versions
        behind the step about to be explored, wait for newer ones (until the stop event). Explore step
        e is trained on from optimizer step e x (optimizer steps per explore step) on: its weights may
        be up to max_staleness versions older than that, the unit the trainer drops in."""
        position = self.explore_step
        if self.stage.plan.trains_on == "pairs":  # tied groups give no pair: the trainer's step that reads next
            position = sum(self.put.values()) // self.cfg.buffer.batch_size
        need = SyncSchedule(self.cfg.synchronizer).oldest_for_explore(position, self.updates_per_step)
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        self._watch_trainer()  # every step: it is seen alive, so that its end is noticed
        wait_s = self.cfg.buffer.trainer_input.experience_buffer.max_wait_s
        what = f"explore step {self.explore_step} of {self.stage.name}"
        newest = None
        if self.by_group:
            self._register()
            newest = self._newest
        latest = wait_for_weights(self.folder, need - 1, wait_s, what, self.stop, self._waiting, newest)
        if latest is None:  # stopped while waiting
            return metrics
        if time.perf_counter() - start > POLL_S:
            metrics["perf/wait_for_weights_s"] = time.perf_counter() - start
        version, path = latest
        if version > self.version and not path:  # the trainer pushed it to every worker
            self.version = version
            log.info("the rollout workers hold version %d (pushed over a group)", version)
        elif version > self.version:  # tasks left running go on (their next engine calls wait for it)
            self.served = announce(version, self.served)
            stats = self._load(path)
            self.version = version
            metrics["perf/load_weights_s"] = stats.get("total_s", 0.0)
            log.info("the rollout workers hold version %d (%s)", version, path)
        return metrics

    def _load(self, path: str) -> dict[str, float]:
        """Have the workers load a published folder; a worker that died meanwhile (here, or in a
        rollout that dropped it) is left out (the launch restarts it and `_follow_workers` takes it
        back) and the others load it."""
        from ..client.base import RpcError
        from ..rollout.remote import GONE

        if self.sender.clients != self.workers.clients:  # a rollout dropped a worker that stopped answering
            self._reconnect()
        try:
            return self.sender.send_checkpoint(path, self.served)
        except Exception:
            gone = []
            for c in self.workers.clients:
                try:
                    c.get_info(timeout=10.0)
                except RpcError as e:
                    if e.code.name not in GONE:
                        raise
                    gone.append(c.address)
            if not gone:
                raise
            if len(gone) == len(self.workers.clients):
                self.workers.forget(gone)
                raise NoWorkerAnswers(f"no rollout worker answers: {', '.join(gone)} stopped") from None
            log.warning("rollout worker(s) %s stopped answering; the others load %s", ", ".join(gone), path)
            self.workers.forget(gone)
            self._reconnect()
            self.served = announce(self.served, self.served)  # some took the version number already
            return self.sender.send_checkpoint(path, self.served)

    def _register(self) -> None:
        """plan.explorer_weights nccl: tell the trainer which workers to push to (when they change),
        and the version they all hold (-1: a restarted one holds older weights)."""
        from ..core.rpc.security import read_token

        now = [c.address for c in self.workers.clients]
        if now != self.registered_workers:
            register_receivers(self.folder, now, self.version, read_token(self.cfg.control.token_env) or "")
            self.registered_workers = now

    def _newest(self) -> tuple[int, str] | None:
        """plan.explorer_weights nccl: the trainer's newest push once every worker serves it (path
        ""), else the newest published folder (what it publishes when no group forms)."""
        from ..client.base import RpcError

        folder, push = latest_published(self.folder), last_push(self.folder)
        if push is None or (folder is not None and folder[0] > push[0]):
            return folder
        try:
            served = [c.get_info(timeout=10.0).policy_version for c in self.workers.clients]
        except RpcError:  # a worker went: the next step leaves it out
            return folder
        self.served = max(self.served, *served)  # folder loads announce past the pushed numbers
        return (push[0], "") if min(served) >= push[1] else folder

    def _reconnect(self) -> None:
        """The weight sender again, to the workers as they are now."""
        from ..weights.sender import connect

        self.sender.close()
        self.sender = connect(self.workers.clients, self.cfg.synchronizer)

    def _follow_workers(self) -> None:
        """The launch's rollout workers as the run lists them now: the ones it removed (dead) left
        out, the ones it restarted (at new addresses) taken in; those then get the newest published
        weights, with the others, before any task (`_follow_trainer` reloads them all)."""
        listed = self.registered() if self.registered is not None else None
        if listed is None:
            return
        were = [c.address for c in self.workers.clients]
        self.workers.forget([a for a in were if a not in listed])
        new = [a for a in listed if a not in were and a not in self.workers.lost]
        fresh = RemoteRollout(self.cfg, new, skip_unreachable=True) if new else None  # not up yet: next step
        if fresh is not None and fresh.clients:
            self.workers.adopt(fresh)
            self._reconnect()
            self.version = -1  # the restarted ones hold the weights they started from
        elif fresh is not None:
            fresh.close()
        now = [c.address for c in self.workers.clients]
        if now != were:
            log.info("rollout workers now: %s (were: %s)", ", ".join(now), ", ".join(were))

    def _wait_for_restarts(self) -> bool:
        """Every rollout worker stopped answering mid-step: wait for the launch to list restarted
        ones; False where it does not restart them, with the task scheduler (tasks in flight on the
        dead workers: the explorer thread restarts the loop from its position instead), or when none
        came: the step then fails."""
        if self.registered is None or self.scheduler is not None:
            return False
        gone = {c.address for c in self.workers.clients} | set(self.workers.lost)
        if not await_restarted(self.cfg, self.registered, gone, self.stop, self.explore_step):
            return False
        self._follow_workers()
        return bool(self.workers.clients)

    def _watch_trainer(self) -> None:
        """Say when the trainer launch went (and came back): the explorer waits for it meanwhile."""
        if self.trainer is not None:
            change = self.trainer.poll(self.cfg.buffer.trainer_input.experience_buffer.max_wait_s)
            if change is not None:
                log.warning("%s", change)

    def _waiting(self) -> bool:
        """While waiting for weights: say when the trainer launch went; True (stop) when the run asks
        to stop (a Ctrl-C of this launch reaches the loop through its heartbeat)."""
        self._watch_trainer()
        if self.reporter is None:
            return False
        answer = self.reporter.heartbeat(
            self.stage.name, self.explore_step, self.total_steps, self.version, wait=False
        )
        if answer == "stop":
            self.stop.set()
        return answer == "stop"

    def _explore(self) -> tuple[list[Experience], dict[str, float]]:
        """The step's experiences (with the task scheduler: every task finished since the last
        step, whichever step sent it) and the scheduler's metrics."""
        tasks, self.resend = self.resend + self.stream.batch(self.explore_step), []
        seed = rollout_seed(self.cfg.seed, self.explore_step)
        if self.scheduler is not None:
            self.scheduler.submit(self.explorer.plan(tasks, seed), self.version)
            return self.scheduler.collect(len(tasks), everything=self.explore_step + 1 == self.total_steps)
        exps = self.explorer.explore(tasks, seed)
        for e in exps:
            e.policy_version = self.version
        return exps, {}


def await_restarted(
    cfg: Any, registered: Callable[[], list[str] | None], gone: set[str], stop: threading.Event, step: int
) -> list[str]:
    """Every rollout worker at `gone` stopped answering: the addresses the launch lists meanwhile
    besides those (restarted workers come back at new ones), waited for as long as its restarts may
    take (backoff 1, 2, ... 2^max_restarts s, then a start within control.worker_start_timeout);
    [] where it restarts none (explorer.rollout_model.max_restarts 0), on `stop`, or past that."""
    rm = cfg.explorer.rollout_model
    if rm.max_restarts == 0:
        return []
    budget_s = 2.0**rm.max_restarts + cfg.control.worker_start_timeout
    log.warning("no rollout worker answers: waiting up to %.0f s for the launch to restart one, then "
                "exploring step %d again", budget_s, step)  # fmt: skip
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline and not stop.is_set():
        fresh = [a for a in registered() or [] if a not in gone]
        if fresh:
            return fresh
        stop.wait(1.0)
    return []


def drive_explorer(stages: list[Stage], all_stages: int, plan: dict[str, Any]) -> int:
    """Mode explore: every explore stage in order, on the launch's rollout workers."""
    from ..client.base import ClientOptions
    from .run_reporter import RunReporter

    base = stages[0].config
    handler = logging.StreamHandler(sys.stdout)  # what the trainer ranks log on theirs, the explorer here
    handler.setFormatter(logging.Formatter("[explorer] %(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    rlcore_log = logging.getLogger("rlcore")
    rlcore_log.addHandler(handler)
    rlcore_log.setLevel(plan.get("log_level", logging.INFO))
    reporter = RunReporter(
        plan["run_address"], ClientOptions.from_control(base.control), base.control.heartbeat_interval
    )
    try:
        for stage in stages:
            sdir = stage_dir(plan["run_dir"], stage, all_stages)
            os.makedirs(sdir, exist_ok=True)
            published = published_dir(trainer_stage_dir(stage.config, stage, all_stages))
            holds = plan["worker_version"] if stage is stages[0] else -1
            trainer = PeerLaunch(os.path.dirname(plan["run_dir"]), "mode-train launch")
            summary = ExploreLoop(
                stage, sdir, published, plan["rollout_endpoints"], holds, reporter, trainer=trainer,
                registered=reporter.rollout_workers if plan["workers_managed"] else None,
            ).run()
            if summary["stopped"]:
                break
    finally:
        reporter.close()
        rlcore_log.removeHandler(handler)
    return 0
