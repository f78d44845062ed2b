"""RunService: the controller's (`rlcore launch`) view of a run, served over gRPC.

Workers (rollout workers, trainer rank 0) register and heartbeat; clients read the status, stream
metrics and pause, resume or stop the run. The launcher drives the lifecycle from Python
(`mark_running`, `mark_finished`, `mark_failed`) and waits here for the workers it spawned.

All state sits behind one lock; a Condition on that lock wakes metric streams and
`wait_for_workers` when something changes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc

from ..core.rpc.address import is_host_port
from ..core.rpc.errors import FailedPrecondition, InvalidArgument, require
from ..core.rpc.server import RpcServer, ServerOptions, Service
from ..proto.v1 import run_pb2, run_pb2_grpc

MAX_HISTORY = 100_000
"""Metrics records kept for StreamMetrics(include_history); older ones are dropped."""
POLL_S = 0.2
"""Longest a waiting stream or wait_for_workers goes without checking cancellation / alive()."""

ROLES = {
    "rollout": run_pb2.WORKER_ROLE_ROLLOUT,
    "trainer": run_pb2.WORKER_ROLE_TRAINER,
    "trainer_node": run_pb2.WORKER_ROLE_TRAINER_NODE,
}
_ROLE_NAMES = {v: k for k, v in ROLES.items()}
_TERMINAL = (run_pb2.RUN_STATE_FINISHED, run_pb2.RUN_STATE_FAILED)


def state_name(state: int) -> str:
    """RUN_STATE_PAUSED -> "PAUSED"."""
    return run_pb2.RunState.Name(state).removeprefix("RUN_STATE_")


@dataclass
class Worker:
    worker_id: str
    role: run_pb2.WorkerRole
    """run_pb2.WorkerRole value."""
    address: str
    index: int
    """Launcher's index, -1 when the worker joined on its own."""
    order: int
    """Registration order (sorts self-joined workers after indexed ones)."""
    last_seen: float
    """time.monotonic() of the registration or the last heartbeat."""
    policy_version: int = 0
    world_attempt: int = 0
    world_failure: str = ""
    """A trainer node's: the world start it is in, and why its share of it failed ("" while it runs)."""


@dataclass
class RunState:
    """Everything the service knows about the run; guarded by RunServicer's lock."""

    run_name: str
    started: float = field(default_factory=time.monotonic)
    state: run_pb2.RunState = run_pb2.RUN_STATE_STARTING
    stage: str = ""
    step: int = 0
    total_steps: int = 0
    error: str = ""
    workers: dict[str, Worker] = field(default_factory=dict)
    registrations: int = 0
    history: deque[run_pb2.MetricsRecord] = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))
    records_seen: int = 0
    """Records ever appended: history[i] is record number records_seen - len(history) + i."""

    def workers_of(self, role: run_pb2.WorkerRole) -> list[Worker]:
        """Workers of `role` in index order, self-joined ones last in registration order."""
        found = [w for w in self.workers.values() if w.role == role]
        return sorted(found, key=lambda w: (w.index < 0, w.index, w.order))

    def records_from(self, cursor: int) -> tuple[list[run_pb2.MetricsRecord], int]:
        """Records numbered cursor.. (from the oldest kept when the cursor fell behind) and the new cursor."""
        first = self.records_seen - len(self.history)
        start = max(cursor - first, 0)
        return [self.history[i] for i in range(start, len(self.history))], self.records_seen


class RunServicer(run_pb2_grpc.RunServiceServicer):
    def __init__(self, run_name: str, heartbeat_interval_s: float):
        self.heartbeat_interval_s = heartbeat_interval_s
        self._run = RunState(run_name)
        self._changed = threading.Condition(threading.Lock())

    # ---- RPCs ------------------------------------------------------------------------------

    def GetStatus(
        self, request: run_pb2.GetStatusRequest, context: grpc.ServicerContext
    ) -> run_pb2.GetStatusResponse:
        now = time.monotonic()
        with self._changed:
            run = self._run
            workers = [
                run_pb2.WorkerStatus(
                    worker_id=w.worker_id,
                    role=w.role,
                    address=w.address,
                    last_seen_s=now - w.last_seen,
                    policy_version=w.policy_version,
                )
                for role in (
                    run_pb2.WORKER_ROLE_TRAINER,
                    run_pb2.WORKER_ROLE_TRAINER_NODE,
                    run_pb2.WORKER_ROLE_ROLLOUT,
                )
                for w in run.workers_of(role)
            ]
            return run_pb2.GetStatusResponse(
                run=run.run_name, state=run.state, stage=run.stage, step=run.step,
                total_steps=run.total_steps, workers=workers, uptime_s=now - run.started, error=run.error,
            )  # fmt: skip

    def StreamMetrics(
        self, request: run_pb2.StreamMetricsRequest, context: grpc.ServicerContext
    ) -> Iterator[run_pb2.MetricsRecord]:
        with self._changed:
            cursor = 0 if request.include_history else self._run.records_seen
        while context.is_active():
            with self._changed:
                self._changed.wait_for(partial(self._has_news, cursor), POLL_S)
                records, cursor = self._run.records_from(cursor)
                ended = self._run.state in _TERMINAL
            # Yield outside the lock: a slow client must not block heartbeats.
            yield from records
            if ended:
                return

    def _has_news(self, cursor: int) -> bool:
        return self._run.records_seen > cursor or self._run.state in _TERMINAL

    def Pause(
        self, request: run_pb2.PauseRunRequest, context: grpc.ServicerContext
    ) -> run_pb2.RunControlResponse:
        return self._transition(run_pb2.RUN_STATE_PAUSED, (run_pb2.RUN_STATE_RUNNING,), "pause")

    def Resume(
        self, request: run_pb2.ResumeRunRequest, context: grpc.ServicerContext
    ) -> run_pb2.RunControlResponse:
        return self._transition(run_pb2.RUN_STATE_RUNNING, (run_pb2.RUN_STATE_PAUSED,), "resume")

    def Stop(
        self, request: run_pb2.StopRunRequest, context: grpc.ServicerContext
    ) -> run_pb2.RunControlResponse:
        allowed = (
            run_pb2.RUN_STATE_STARTING, run_pb2.RUN_STATE_RUNNING, run_pb2.RUN_STATE_PAUSED,
            run_pb2.RUN_STATE_STOPPING,
        )  # fmt: skip
        return self._transition(run_pb2.RUN_STATE_STOPPING, allowed, "stop")

    def RegisterWorker(
        self, request: run_pb2.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> run_pb2.RegisterWorkerResponse:
        require(
            request.role in _ROLE_NAMES,
            "role",
            f"must be WORKER_ROLE_ROLLOUT, WORKER_ROLE_TRAINER or WORKER_ROLE_TRAINER_NODE; got {request.role} (0 is UNSPECIFIED)",
        )
        if request.role == run_pb2.WORKER_ROLE_ROLLOUT or request.address:
            require(
                is_host_port(request.address),
                "address",
                f"must be host:port (rollout workers serve RolloutService there); got '{request.address}'",
            )
        require(
            request.index >= -1, "index", f"must be >= 0, or -1 for a self-joined worker; got {request.index}"
        )
        role_name = _ROLE_NAMES[request.role]
        with self._changed:
            run = self._run
            if request.index >= 0:
                # The same index again is the launcher's worker restarted: it replaces the old entry.
                worker_id = f"{role_name}-{request.index}"
                holder = run.workers.get(worker_id)
                if holder is not None and holder.index < 0:
                    raise FailedPrecondition(
                        f"worker id {worker_id} is taken by a worker that joined on its own "
                        f"({holder.address or 'no address'}); do not mix indexed and self-joined "
                        f"{role_name} workers"
                    )
            else:
                n = len(run.workers_of(request.role))
                while f"{role_name}-{n}" in run.workers:
                    n += 1
                worker_id = f"{role_name}-{n}"
            run.workers[worker_id] = Worker(
                worker_id, request.role, request.address, request.index, run.registrations, time.monotonic()
            )
            run.registrations += 1
            if request.role == run_pb2.WORKER_ROLE_TRAINER and run.state == run_pb2.RUN_STATE_STARTING:
                run.state = run_pb2.RUN_STATE_RUNNING
            self._changed.notify_all()
        return run_pb2.RegisterWorkerResponse(
            worker_id=worker_id, heartbeat_interval_s=self.heartbeat_interval_s
        )

    def Heartbeat(
        self, request: run_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> run_pb2.HeartbeatResponse:
        with self._changed:
            run = self._run
            worker = run.workers.get(request.worker_id)
            if worker is None:
                known = ", ".join(sorted(run.workers)) or "none"
                raise InvalidArgument(
                    "worker_id",
                    f"'{request.worker_id}' is not registered (known: {known}); call RegisterWorker",
                )
            worker.last_seen = time.monotonic()
            worker.policy_version = request.policy_version
            worker.world_attempt, worker.world_failure = request.world_attempt, request.world_failure
            if worker.role == run_pb2.WORKER_ROLE_TRAINER:
                run.stage, run.step, run.total_steps = request.stage, request.step, request.total_steps
            if request.records:
                run.history.extend(request.records)
                run.records_seen += len(request.records)
                self._changed.notify_all()
            return run_pb2.HeartbeatResponse(state=run.state)

    def _transition(
        self, target: run_pb2.RunState, allowed: tuple[run_pb2.RunState, ...], verb: str
    ) -> run_pb2.RunControlResponse:
        with self._changed:
            if self._run.state not in allowed:
                raise FailedPrecondition(
                    f"cannot {verb} a run that is {state_name(self._run.state)}; "
                    f"{verb} needs {' or '.join(state_name(s) for s in allowed)}"
                )
            self._run.state = target
            self._changed.notify_all()
            return run_pb2.RunControlResponse(state=target)

    # ---- Python API for the launcher -------------------------------------------------------

    def mark_running(self) -> None:
        """Training started (a trainer registering does the same). A stop asked for while the run
        was starting is kept."""
        self._set_from(run_pb2.RUN_STATE_STARTING, run_pb2.RUN_STATE_RUNNING)

    def mark_finished(self) -> None:
        """The run ended normally; open metric streams end after their last records."""
        self._end(run_pb2.RUN_STATE_FINISHED, "")

    def mark_failed(self, reason: str) -> None:
        """The run ended with an error; GetStatus reports `reason`."""
        self._end(run_pb2.RUN_STATE_FAILED, reason)

    def request_stop(self) -> None:
        """Ask the run to stop after its current step (as the Stop call does); nothing once it ended."""
        with self._changed:
            if self._run.state not in _TERMINAL:
                self._run.state = run_pb2.RUN_STATE_STOPPING
                self._changed.notify_all()

    def remove_worker(self, role: str, index: int) -> None:
        """The launcher's worker `index` of `role` is gone (its process exited)."""
        with self._changed:
            self._run.workers.pop(f"{role}-{index}", None)
            self._changed.notify_all()

    def silent(self, role: str, quiet_s: float) -> list[tuple[int, str, float]]:
        """(index, address, seconds since its last heartbeat) of each registered worker of `role`
        that has been quiet for longer than `quiet_s`."""
        now = time.monotonic()
        with self._changed:
            return [
                (w.index, w.address, now - w.last_seen)
                for w in self._run.workers_of(ROLES[role])
                if now - w.last_seen > quiet_s
            ]

    def node_failures(self, attempt: int) -> list[tuple[int, str]]:
        """(index, why) of each trainer node whose share of world start `attempt` (or a later one) failed."""
        with self._changed:
            return [
                (w.index, w.world_failure)
                for w in self._run.workers_of(run_pb2.WORKER_ROLE_TRAINER_NODE)
                if w.world_failure and w.world_attempt >= attempt
            ]

    def progress(self) -> tuple[str, int, int]:
        """(stage, step, total steps) as the trainer last reported them."""
        with self._changed:
            return self._run.stage, self._run.step, self._run.total_steps

    def requested_state(self) -> str:
        """What clients want now: "RUNNING", "PAUSED", "STOPPING" (or STARTING/FINISHED/FAILED)."""
        with self._changed:
            return state_name(self._run.state)

    def rollout_addresses(self) -> list[str]:
        """Addresses of the registered rollout workers in index order."""
        with self._changed:
            return [w.address for w in self._run.workers_of(run_pb2.WORKER_ROLE_ROLLOUT)]

    def wait_for_workers(
        self, role: str, count: int, timeout_s: float, alive: Callable[[], str | None]
    ) -> list[str]:
        """Block until `count` workers of `role` ("rollout" | "trainer") registered; their addresses
        in index order. `alive()` answers an error message once a spawned worker died: that is
        raised at once as RuntimeError instead of waiting out the timeout."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got '{role}'")
        deadline = time.monotonic() + timeout_s
        enough = partial(self._has_workers, ROLES[role], count)
        while True:
            with self._changed:
                workers = self._run.workers_of(ROLES[role])
            if len(workers) >= count:
                return [w.address for w in workers]
            problem = alive()
            if problem is not None:
                raise RuntimeError(problem)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{len(workers)} of {count} {role} workers registered within {timeout_s:g} s; if they "
                    f"need longer to start, raise control.worker_start_timeout"
                )
            with self._changed:
                self._changed.wait_for(enough, min(left, POLL_S))

    def _has_workers(self, role: run_pb2.WorkerRole, count: int) -> bool:
        return len(self._run.workers_of(role)) >= count

    def _set_from(self, current: run_pb2.RunState, target: run_pb2.RunState) -> None:
        with self._changed:
            if self._run.state == current:
                self._run.state = target
                self._changed.notify_all()

    def _end(self, state: run_pb2.RunState, error: str) -> None:
        with self._changed:
            assert self._run.state not in _TERMINAL, f"run already ended ({state_name(self._run.state)})"
            self._run.state, self._run.error = state, error
            self._changed.notify_all()


def start_run_server(
    run_name: str, options: ServerOptions, heartbeat_interval_s: float, serve_buffer: bool = False,
    buffers: dict[str, Any] | None = None,
) -> tuple[RpcServer, RunServicer]:  # fmt: skip
    """Serve RunService for `run_name` (project/name), and with `serve_buffer` the experience
    buffer's queues (ExperienceBufferService; `buffers`: their configs by name); the servicer is
    the launcher's handle."""
    servicer = RunServicer(run_name, heartbeat_interval_s)
    services = [
        Service(
            run_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
            servicer,
            run_pb2_grpc.add_RunServiceServicer_to_server,
        )
    ]
    if serve_buffer:
        from ..buffer.service import BufferServicer, buffer_service

        services.append(buffer_service(BufferServicer(f"the controller of {run_name}", buffers)))
    return RpcServer(options, services), servicer
