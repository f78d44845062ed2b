"""Clients of a run's RunService (served by `rlcore launch`): watch it, steer it, or join it as a worker.

States are answered as their short names ("STARTING", "RUNNING", "PAUSED", "STOPPING", "FINISHED",
"FAILED") and roles as "rollout" | "trainer", so callers never touch protobuf enums.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from ..proto.v1 import run_pb2, run_pb2_grpc
from .base import AsyncClient, BlockingClient

_ROLES = {
    "rollout": run_pb2.WORKER_ROLE_ROLLOUT,
    "trainer": run_pb2.WORKER_ROLE_TRAINER,
    "trainer_node": run_pb2.WORKER_ROLE_TRAINER_NODE,
}
_ROLE_NAMES = {v: k for k, v in _ROLES.items()}


@dataclass
class MetricsRecord:
    """Metrics logged at one step."""

    stage: str
    step: int
    metrics: dict[str, float]
    time: float
    """Unix time the trainer logged it."""


@dataclass
class WorkerInfo:
    worker_id: str
    role: str
    """"rollout" or "trainer"."""
    address: str
    last_seen_s: float
    """Seconds since its last heartbeat."""
    policy_version: int


@dataclass
class RunStatus:
    run: str
    """project/name."""
    state: str
    stage: str
    step: int
    total_steps: int
    workers: list[WorkerInfo] = field(default_factory=list)
    uptime_s: float = 0.0
    error: str = ""
    """Reason when state is FAILED."""


def _state(value: int) -> str:
    return run_pb2.RunState.Name(value).removeprefix("RUN_STATE_")


def record_to_proto(r: MetricsRecord) -> run_pb2.MetricsRecord:
    return run_pb2.MetricsRecord(stage=r.stage, step=r.step, metrics=r.metrics, time=r.time)


def record_from_proto(msg: run_pb2.MetricsRecord) -> MetricsRecord:
    return MetricsRecord(stage=msg.stage, step=msg.step, metrics=dict(msg.metrics), time=msg.time)


def _status_from_proto(msg: run_pb2.GetStatusResponse) -> RunStatus:
    workers = [
        WorkerInfo(
            w.worker_id, _ROLE_NAMES.get(w.role, "unspecified"), w.address, w.last_seen_s, w.policy_version
        )
        for w in msg.workers
    ]
    return RunStatus(
        run=msg.run, state=_state(msg.state), stage=msg.stage, step=msg.step, total_steps=msg.total_steps,
        workers=workers, uptime_s=msg.uptime_s, error=msg.error,
    )  # fmt: skip


def _register_request(role: str, address: str, index: int) -> run_pb2.RegisterWorkerRequest:
    if role not in _ROLES:
        raise ValueError(f"role must be one of {', '.join(_ROLES)}; got '{role}'")
    return run_pb2.RegisterWorkerRequest(role=_ROLES[role], address=address, index=index)


def _heartbeat_request(
    worker_id: str,
    stage: str,
    step: int,
    total_steps: int,
    policy_version: int,
    records: Sequence[MetricsRecord],
    world_attempt: int = 0,
    world_failure: str = "",
) -> run_pb2.HeartbeatRequest:
    return run_pb2.HeartbeatRequest(
        worker_id=worker_id, stage=stage, step=step, total_steps=total_steps, policy_version=policy_version,
        records=[record_to_proto(r) for r in records], world_attempt=world_attempt, world_failure=world_failure,
    )  # fmt: skip


class RunClient(BlockingClient):
    """Blocking client of RunService. Every call has a deadline (options.timeout unless given)."""

    role = "run controller"
    stub_class = run_pb2_grpc.RunServiceStub

    def get_status(self, timeout: float | None = None) -> RunStatus:
        return _status_from_proto(self._unary("GetStatus", run_pb2.GetStatusRequest(), timeout))

    def stream_metrics(
        self, include_history: bool = False, timeout: float | None = None
    ) -> Iterator[MetricsRecord]:
        """Records as the trainer reports them, until the run ends. `timeout` bounds the whole stream
        (options.timeout when None): a watcher of a long run passes a long one."""
        request = run_pb2.StreamMetricsRequest(include_history=include_history)
        for msg in self._stream("StreamMetrics", request, timeout):
            yield record_from_proto(msg)

    def pause(self) -> str:
        """Ask the trainer to pause after its current step; answers the new state."""
        return _state(self._unary("Pause", run_pb2.PauseRunRequest()).state)

    def resume(self) -> str:
        return _state(self._unary("Resume", run_pb2.ResumeRunRequest()).state)

    def stop(self) -> str:
        """Ask the trainer to checkpoint after its current step and end the run."""
        return _state(self._unary("Stop", run_pb2.StopRunRequest()).state)

    def register_worker(self, role: str, address: str = "", index: int = -1) -> tuple[str, float]:
        """Join the run; answers (worker_id, heartbeat interval in seconds)."""
        response = self._unary("RegisterWorker", _register_request(role, address, index))
        return response.worker_id, response.heartbeat_interval_s

    def heartbeat(
        self,
        worker_id: str,
        stage: str = "",
        step: int = 0,
        total_steps: int = 0,
        policy_version: int = 0,
        records: Sequence[MetricsRecord] = (),
        world_attempt: int = 0,
        world_failure: str = "",
    ) -> str:
        """Report progress (and the metrics logged since the last heartbeat, oldest first; a trainer
        node: the world start it is in, and why its share failed); answers what the run wants:
        "RUNNING", "PAUSED" (wait, keep heartbeating) or "STOPPING"."""
        request = _heartbeat_request(
            worker_id, stage, step, total_steps, policy_version, records, world_attempt, world_failure
        )
        return _state(self._unary("Heartbeat", request).state)


class AsyncRunClient(AsyncClient):
    """asyncio client of RunService; the same calls as RunClient."""

    role = "run controller"
    stub_class = run_pb2_grpc.RunServiceStub

    async def get_status(self, timeout: float | None = None) -> RunStatus:
        return _status_from_proto(await self._unary("GetStatus", run_pb2.GetStatusRequest(), timeout))

    async def stream_metrics(
        self, include_history: bool = False, timeout: float | None = None
    ) -> AsyncIterator[MetricsRecord]:
        request = run_pb2.StreamMetricsRequest(include_history=include_history)
        async for msg in self._stream("StreamMetrics", request, timeout):
            yield record_from_proto(msg)

    async def pause(self) -> str:
        return _state((await self._unary("Pause", run_pb2.PauseRunRequest())).state)

    async def resume(self) -> str:
        return _state((await self._unary("Resume", run_pb2.ResumeRunRequest())).state)

    async def stop(self) -> str:
        return _state((await self._unary("Stop", run_pb2.StopRunRequest())).state)

    async def register_worker(self, role: str, address: str = "", index: int = -1) -> tuple[str, float]:
        response = await self._unary("RegisterWorker", _register_request(role, address, index))
        return response.worker_id, response.heartbeat_interval_s

    async def heartbeat(
        self,
        worker_id: str,
        stage: str = "",
        step: int = 0,
        total_steps: int = 0,
        policy_version: int = 0,
        records: Sequence[MetricsRecord] = (),
    ) -> str:
        request = _heartbeat_request(worker_id, stage, step, total_steps, policy_version, records)
        return _state((await self._unary("Heartbeat", request)).state)
