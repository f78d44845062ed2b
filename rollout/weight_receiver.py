"""A rollout worker's side of weight sync (InitWeightSync / BeginWeightUpdate / FinishWeightUpdate;
the protocol is in rlcore.core.weight_sync).

Begin closes the generation gate and starts a thread that waits for running generation, then
receives the buckets and loads them into the engine under the engine lock; Finish joins it and
reopens the gate. A failed update leaves the gate closed: the weights may be partly replaced.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.rpc.errors import DeadlineExceeded, FailedPrecondition, ServiceError, require
from ..core.weight_sync import (
    SyncGroup,
    TensorSpec,
    init_group,
    plan_buckets,
    receive_weights,
    specs_from_proto,
)
from ..proto.v1 import rollout_pb2
from .engines.base import RolloutEngine
from .gate import GenerationGate

log = logging.getLogger("rlcore.rollout.weights")


@dataclass
class _Update:
    """A weight update between BeginWeightUpdate and FinishWeightUpdate."""

    version: int
    thread: threading.Thread | None = None
    phase: str = "waiting for running generation to finish"
    stats: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0
    error: BaseException | None = None


class WeightReceiver:
    def __init__(self, engine: RolloutEngine, engine_lock: threading.Lock, gate: GenerationGate, device: str):
        self.engine, self.engine_lock, self.gate, self.device = engine, engine_lock, gate, device
        self._lock = threading.Lock()
        self._group: SyncGroup | None = None
        self._update: _Update | None = None

    def open_gate(self) -> None:
        """Resume generation, unless an update is running (FinishWeightUpdate resumes then)."""
        with self._lock:
            update = self._update
            if update is not None and update.thread is not None and update.thread.is_alive():
                raise FailedPrecondition(
                    f"a weight update to version {update.version} is running; FinishWeightUpdate resumes"
                )
            self.gate.open()

    def init(self, r: rollout_pb2.InitWeightSyncRequest) -> rollout_pb2.InitWeightSyncResponse:
        require(bool(r.master_address), "master_address", "must be non-empty")
        require(1 <= r.master_port <= 65535, "master_port", f"must be in 1..65535; got {r.master_port}")
        require(
            r.world_size >= 2, "world_size", f"must be >= 2 (a sender and this worker); got {r.world_size}"
        )
        require(1 <= r.rank < r.world_size, "rank", f"must be in 1..{r.world_size - 1}; got {r.rank}")
        require(r.backend in ("gloo", "nccl"), "backend", f"must be gloo or nccl; got '{r.backend}'")
        require(
            math.isfinite(r.timeout_s) and r.timeout_s > 0, "timeout_s", f"must be > 0; got {r.timeout_s}"
        )
        require(bool(r.group_name), "group_name", "must be non-empty")
        with self._lock:
            self._check_no_running_update()
            # A new group replaces the old one (the sender re-forms it after a failed collective).
            self._group = None
        try:  # outside the lock: forming the group blocks until the sender joins
            group = init_group(
                r.master_address, r.master_port, r.world_size, r.rank, r.backend, r.timeout_s, r.group_name
            )
        except RuntimeError as e:
            raise DeadlineExceeded(
                f"weight-sync group '{r.group_name}' at {r.master_address}:{r.master_port} did not form "
                f"within {r.timeout_s:g} s: {e}"
            ) from None
        with self._lock:
            self._group = group
        return rollout_pb2.InitWeightSyncResponse(rank=r.rank)

    def _check_no_running_update(self) -> None:
        """Refuse while an update thread runs; forget a finished one nobody collected (the sender
        gave up on it and starts over)."""
        update = self._update
        if update is None:
            return
        if update.thread is not None and update.thread.is_alive():
            raise FailedPrecondition(
                f"the weight update to version {update.version} is still running ({update.phase}); "
                "call FinishWeightUpdate first"
            )
        log.warning("dropping the uncollected weight update to version %d", update.version)
        self._update = None

    def begin(self, request: rollout_pb2.BeginWeightUpdateRequest) -> rollout_pb2.BeginWeightUpdateResponse:
        with self._lock:
            group = self._group
            if group is None:
                raise FailedPrecondition("no weight-sync group: call InitWeightSync first")
            self._check_no_running_update()
            current = self.engine.policy_version
            require(
                request.policy_version > current,
                "policy_version",
                f"must be greater than the version served now ({current}); got {request.policy_version}",
            )
            specs = specs_from_proto(request.tensors, "tensors")
            require(request.bucket_bytes > 0, "bucket_bytes", f"must be > 0; got {request.bucket_bytes}")
            num_buckets = len(plan_buckets(specs, request.bucket_bytes))
            self.gate.close()
            update = _Update(request.policy_version)
            update.thread = threading.Thread(
                target=self._receive_and_load,
                args=(update, group, specs, request.bucket_bytes),
                name=f"weight-update-v{request.policy_version}",
                daemon=True,
            )
            self._update = update
            update.thread.start()
        return rollout_pb2.BeginWeightUpdateResponse(num_buckets=num_buckets)

    def _receive_and_load(
        self, update: _Update, group: SyncGroup, specs: list[TensorSpec], bucket_bytes: int
    ) -> None:
        try:
            self.gate.wait_idle()
            with self.engine_lock:
                start = time.perf_counter()
                weights = receive_weights(group, specs, bucket_bytes, self.device, update.stats)
                self.engine.load_weights(_tracked(update, weights), update.version)
                update.load_s = time.perf_counter() - start - update.stats.get("receive_s", 0.0)
        except BaseException as e:  # reported by FinishWeightUpdate
            update.error = e

    def finish(
        self, request: rollout_pb2.FinishWeightUpdateRequest
    ) -> rollout_pb2.FinishWeightUpdateResponse:
        with self._lock:
            update, group = self._update, self._group
            if update is None or group is None:
                raise FailedPrecondition("no weight update is pending: call BeginWeightUpdate first")
            require(
                request.policy_version == update.version,
                "policy_version",
                f"must be {update.version}, the version BeginWeightUpdate announced; got {request.policy_version}",
            )
        assert update.thread is not None
        update.thread.join(timeout=group.timeout_s)
        what = f"weight update to version {update.version}"
        if update.thread.is_alive():
            raise DeadlineExceeded(
                f"{what} did not finish within {group.timeout_s:g} s (phase: {update.phase}); the worker "
                f"stays paused serving version {self.engine.policy_version}"
            )
        with self._lock:
            if self._update is not update:
                raise FailedPrecondition(f"{what} was already finished by another call")
            self._update = None
        if update.error is not None:
            raise ServiceError(
                f"{what} failed while {update.phase}: {type(update.error).__name__}: {update.error}; the worker "
                f"stays paused (its weights may be partly replaced); sync a new version to recover"
            )
        self.engine.policy_version = update.version
        self.gate.open()
        self.engine.resume()
        return rollout_pb2.FinishWeightUpdateResponse(
            policy_version=update.version,
            num_bytes=int(update.stats["num_bytes"]),
            receive_s=update.stats["receive_s"],
            load_s=update.load_s,
        )


def _tracked(update: _Update, weights: Iterator[Any]) -> Iterator[Any]:
    """Pass `weights` through, recording whether the update is receiving or loading."""
    while True:
        update.phase = "receiving"
        try:
            item = next(weights)
        except StopIteration:
            return
        update.phase = "loading"
        yield item
