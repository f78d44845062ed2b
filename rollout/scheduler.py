"""The explorer's task scheduler: a step's tasks one by one across the rollout workers, for long
tails (explorer.over_rollout, explorer.dynamic_timeout; mode explore and asynchronous `both`).

Each task is a RunTasks call of its own on the least busy worker (the worker merges the engine
calls of the tasks it runs at once: batching.py). Then:

- over-rollout: `collect` returns once at most ratio x batch tasks still run (so a step's tasks are
  done but that share, and no more than that share is ever left over), waits up to wait_after_min
  seconds more for the rest, and leaves whatever still runs to feed the next step; tasks left
  running go on across a weight load (the worker's engine calls, not its tasks, hold a load back);
- dynamic timeout: a task may take dynamic_timeout.ratio times the running mean of the finished
  tasks' seconds (at least 1 s, at most explorer.max_timeout); a slower one is cut (its call's
  deadline);
- a task that fails or is cut is retried up to explorer.max_retry_times, then left out of the run
  (counted); a worker that stops answering is dropped and its tasks go to the others, uncounted;
  bad input (INVALID_ARGUMENT: a reward function refused a task) stops the run.

Every experience carries the policy version the workers held when its task was sent.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from ..client.base import RpcError
from ..client.rollout import RolloutClient
from ..core.config.schema import RLCoreConfig
from ..core.types import Experience, SamplingParams, Task, WorkflowSpec
from .remote import LOST, RemoteRollout, liveness

log = logging.getLogger("rlcore.explorer")

TASKS_PER_WORKER = 8
"""Tasks in flight on one rollout worker (its server runs 16 calls at once: the rest stay free for
weight loads, health checks and the OpenAI-compatible door)."""
MIN_DYNAMIC_TIMEOUT_S = 1.0
"""The dynamic timeout never cuts a task sooner (sub-second deadlines would cut on jitter alone)."""
WINDOW = 64
"""Finished tasks the dynamic timeout's running mean is over."""


_ORDER = itertools.count()


@dataclass(eq=False)
class _Unit:
    task: Task
    sampling: SamplingParams
    spec: WorkflowSpec
    version: int
    attempt: int = 0
    order: int = field(default_factory=lambda: next(_ORDER))


class TaskScheduler:
    def __init__(self, cfg: RLCoreConfig, rollout: RemoteRollout):
        ex = cfg.explorer
        self.ratio, self.wait_after_min = ex.over_rollout.ratio, ex.over_rollout.wait_after_min
        self.dynamic_ratio = ex.dynamic_timeout.ratio if ex.dynamic_timeout.enable else None
        self.max_timeout, self.max_retries = ex.max_timeout, ex.max_retry_times
        self.rollout = rollout
        self._cond = threading.Condition()
        self._running = 0
        """Tasks sent and not settled (finished or left out), retries included once."""
        self._units: set[_Unit] = set()
        """Those tasks."""
        self._finished: list[Experience] = []
        self._finished_tasks = 0
        self._seconds: deque[float] = deque(maxlen=WINDOW)
        self._busy: dict[str, int] = {}
        self._counts: Counter[str] = Counter()
        self._fatal: BaseException | None = None
        # daemon threads of our own, not a ThreadPoolExecutor (whose threads the interpreter joins at
        # exit): a process that stops exploring is not held by a call still waiting on a slow task
        self._queue: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"rlcore-task-{i}", daemon=True)
            for i in range(TASKS_PER_WORKER * max(1, len(rollout.clients)))
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ the explorer's side

    def submit(self, plan: list[tuple[Task, SamplingParams, WorkflowSpec]], version: int) -> None:
        """Send each (task, its sampling, its workflow) to run on weights of `version`."""
        units = [_Unit(task, sampling, spec, version) for task, sampling, spec in plan]
        with self._cond:
            self._running += len(units)
            self._units.update(units)
        for unit in units:
            self._send(unit)

    def running_tasks(self) -> list[Task]:
        """The tasks sent and not settled yet, in the order they were sent (what an explorer that
        stops now would lose: its state keeps them to send again)."""
        with self._cond:
            return [u.task for u in sorted(self._units, key=lambda u: u.order)]

    def collect(self, batch: int, everything: bool = False) -> tuple[list[Experience], dict[str, float]]:
        """The finished tasks' experiences (task by task) once at most ratio x `batch` tasks still
        run (a step's tasks done but that share, whichever step sent the rest), or none with
        `everything` (a stage's last step), and the step's scheduler metrics."""
        allowed = 0 if everything else math.floor(self.ratio * batch)
        with self._cond:
            self._cond.wait_for(lambda: self._fatal is not None or self._running <= allowed)
            if everything or self.wait_after_min > 0:
                self._cond.wait_for(
                    lambda: self._fatal is not None or not self._running,
                    timeout=None if everything else self.wait_after_min,
                )
            if self._fatal is not None:
                raise self._fatal
            exps, self._finished = self._finished, []
            metrics = {
                "rollout/tasks_done": float(self._finished_tasks),
                "rollout/tasks_left_running": float(self._running),
                "rollout/task_timeout_s": self._timeout_locked(),
                **{f"rollout/tasks_{k}": float(v) for k, v in self._counts.items()},
            }
            if self._seconds:
                metrics["rollout/task_s_mean"] = statistics.fmean(self._seconds)
            self._finished_tasks = 0
            self._counts.clear()
        return exps, metrics

    def close(self) -> None:
        """Stop sending; tasks still running are abandoned (their calls end with their deadlines,
        in daemon threads)."""
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)

    def _send(self, unit: _Unit) -> None:
        if self._closed:
            raise RuntimeError("the task scheduler is closed")
        self._queue.put(unit)

    def _serve(self) -> None:
        """One of the threads that run tasks, until close."""
        while (unit := self._queue.get()) is not None:
            if not self._closed:
                self._run(unit)

    # ------------------------------------------------------------------ one task

    def timeout(self) -> float:
        with self._cond:
            return self._timeout_locked()

    def _timeout_locked(self) -> float:
        if self.dynamic_ratio is None or not self._seconds:
            return self.max_timeout
        dynamic = max(MIN_DYNAMIC_TIMEOUT_S, self.dynamic_ratio * statistics.fmean(self._seconds))
        return min(self.max_timeout, dynamic)

    def _run(self, unit: _Unit) -> None:
        try:
            self._attempt(unit)
        except BaseException as e:  # the explorer raises it from collect
            with self._cond:
                self._fatal = self._fatal or e
                self._cond.notify_all()

    def _attempt(self, unit: _Unit) -> None:
        client = self._pick()
        timeout = self.timeout()
        start = time.monotonic()
        try:
            exps = [
                e
                for _, group in client.run_tasks([unit.task], unit.sampling, unit.spec, timeout)
                for e in group
            ]
        except RpcError as error:
            self._release(client)
            self._failed(unit, client, error, timeout)
            return
        self._release(client)
        for x in exps:
            x.policy_version = unit.version
        with self._cond:
            self._seconds.append(time.monotonic() - start)
            self._finished += exps
            self._finished_tasks += 1
            self._running -= 1
            self._units.discard(unit)
            self._cond.notify_all()

    def _failed(self, unit: _Unit, client: RolloutClient, error: RpcError, timeout: float) -> None:
        code = error.code.name
        if code == "INVALID_ARGUMENT":  # the worker refused the task itself: retrying cannot help
            raise error
        if code in LOST and liveness(client) is None:
            self.rollout.drop(client, error)
            self._send(unit)  # on another worker, not counted as a retry
            return
        cut = code == "DEADLINE_EXCEEDED"
        with self._cond:
            self._counts["timed_out" if cut else "failed"] += 1
        what = f"took longer than {timeout:.1f} s" if cut else f"failed ({error})"
        if unit.attempt < self.max_retries:
            unit.attempt += 1
            with self._cond:
                self._counts["retried"] += 1
            log.warning("task %s %s; retry %d/%d", unit.task.task_id, what, unit.attempt, self.max_retries)
            self._send(unit)
            return
        log.warning(
            "task %s %s; left out after %d retries (explorer.max_retry_times)",
            unit.task.task_id, what, self.max_retries,
        )  # fmt: skip
        with self._cond:
            self._counts["dropped"] += 1
            self._running -= 1
            self._units.discard(unit)
            self._cond.notify_all()

    def _pick(self) -> RolloutClient:
        """The answering worker with the fewest tasks of ours running."""
        with self._cond:
            if not self.rollout.clients:
                raise RuntimeError(f"no rollout worker answers: {', '.join(self.rollout.lost)} stopped")
            client = min(self.rollout.clients, key=lambda c: self._busy.get(c.address, 0))
            self._busy[client.address] = self._busy.get(client.address, 0) + 1
            return client

    def _release(self, client: RolloutClient) -> None:
        with self._cond:
            self._busy[client.address] -= 1
