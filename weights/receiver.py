"""A rollout worker's side of weight sync (InitWeightSync / BeginWeightUpdate / FinishWeightUpdate;
the protocol is in rlcore.weights.wire): the state machine every transport's worker half runs in
(the halves themselves: `receiver_half` in group.py and checkpoint.py).

The engine owns the group membership and the receiving (the HF engine receives in this process, a
vLLM engine in its worker processes); this class orchestrates: Begin closes the generation gate and
starts a thread that waits for running generation, then receives and loads under the engine lock;
Finish joins it and reopens the gate. A failed transfer leaves the gate closed (the weights may be
partly replaced), except a checksum failure: nothing was loaded, so the worker keeps serving the
last good version.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from ..core.rpc.errors import DataLoss, DeadlineExceeded, FailedPrecondition, ServiceError, require
from ..proto.v1 import rollout_pb2
from . import TRANSPORTS
from .base import Gate, PendingUpdate, WeightSink
from .wire import WeightCorruption

log = logging.getLogger("rlcore.rollout.weights")


class WeightReceiver:
    def __init__(self, engine: WeightSink, engine_lock: threading.Lock, gate: Gate):
        self.engine, self.engine_lock, self.gate = engine, engine_lock, gate
        self._lock = threading.Lock()
        self._joined = False
        self._timeout_s = 600.0
        self._update: PendingUpdate | None = None

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
        n = self.engine.weight_sync_ranks
        require(bool(r.master_address), "master_address", "must be non-empty")
        require(1 <= r.master_port <= 65535, "master_port", f"must be in 1..65535; got {r.master_port}")
        require(
            r.world_size >= 1 + n,
            "world_size",
            f"must be >= {1 + n} (a sender and this worker's {n} rank(s)); got {r.world_size}",
        )
        require(
            1 <= r.rank <= r.world_size - n,
            "rank",
            f"must be in 1..{r.world_size - n} (this worker takes {n} rank(s) from it); got {r.rank}",
        )
        require(r.backend in ("gloo", "nccl"), "backend", f"must be gloo or nccl; got '{r.backend}'")
        require(
            math.isfinite(r.timeout_s) and r.timeout_s > 0, "timeout_s", f"must be > 0; got {r.timeout_s}"
        )
        require(bool(r.group_name), "group_name", "must be non-empty")
        self._await_abandoned_update(r.timeout_s)
        with self._lock:
            self._check_no_running_update()
            self._joined = False  # a new group replaces the old one (re-formed after a failure)
        try:  # outside the lock: forming the group blocks until the sender joins
            with self.engine_lock:
                self.engine.join_weight_sync(
                    r.master_address, r.master_port, r.world_size, r.rank, r.backend, r.timeout_s,
                    r.group_name,
                )  # fmt: skip
        except (RuntimeError, TimeoutError) as e:
            raise DeadlineExceeded(
                f"weight-sync group '{r.group_name}' at {r.master_address}:{r.master_port} did not form "
                f"within {r.timeout_s:g} s: {e}"
            ) from None
        with self._lock:
            self._joined, self._timeout_s = True, r.timeout_s
        return rollout_pb2.InitWeightSyncResponse(rank=r.rank, num_ranks=n)

    def _await_abandoned_update(self, timeout_s: float) -> None:
        """A new group means its sender gave up on the update still running here (it saw the
        transfer fail first, e.g. the receive timing out on a loaded machine): that receive ends
        as its group's peer is gone, so wait for it up to the new group's timeout rather than
        refuse a sender that retries at once."""
        with self._lock:
            update = self._update
        if update is not None and update.thread is not None and update.thread.is_alive():
            log.warning(
                "a new weight-sync group while the update to version %d is %s: waiting up to %g s for it to end",
                update.version, update.phase, timeout_s,
            )  # fmt: skip
            update.thread.join(timeout=timeout_s)

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
            self._check_no_running_update()
            current = self.engine.policy_version
            require(
                request.policy_version > current,
                "policy_version",
                f"must be greater than the version served now ({current}); got {request.policy_version}",
            )
            update = PendingUpdate(request.policy_version)
            # the transport that sent it: a folder to load (checkpoint, publish), or buckets (nccl)
            kind = "checkpoint" if request.checkpoint_path else "nccl"
            num_buckets, work = TRANSPORTS.resolve(kind).receiver_half(self.engine, request, update, self._joined)
            self.gate.close()
            update.thread = threading.Thread(
                target=self._apply, args=(update, work), name=f"weight-update-v{request.policy_version}", daemon=True
            )
            self._update = update
            update.thread.start()
        return rollout_pb2.BeginWeightUpdateResponse(num_buckets=num_buckets)

    def _apply(self, update: PendingUpdate, work: Callable[[], None]) -> None:
        """The update's thread: once running generation has finished, the transport's work under the
        engine lock; what it raises is FinishWeightUpdate's to report."""
        try:
            self.gate.wait_idle()
            with self.engine_lock:
                work()
        except BaseException as e:  # reported by FinishWeightUpdate
            update.error = e

    def finish(
        self, request: rollout_pb2.FinishWeightUpdateRequest
    ) -> rollout_pb2.FinishWeightUpdateResponse:
        with self._lock:
            update = self._update
            if update is None:
                raise FailedPrecondition("no weight update is pending: call BeginWeightUpdate first")
            require(
                request.policy_version == update.version,
                "policy_version",
                f"must be {update.version}, the version BeginWeightUpdate announced; got {request.policy_version}",
            )
        assert update.thread is not None
        update.thread.join(timeout=self._timeout_s)
        what = f"weight update to version {update.version}"
        if update.thread.is_alive():
            raise DeadlineExceeded(
                f"{what} did not finish within {self._timeout_s:g} s (phase: {update.phase}); the worker "
                f"stays paused serving version {self.engine.policy_version}"
            )
        with self._lock:
            if self._update is not update:
                raise FailedPrecondition(f"{what} was already finished by another call")
            self._update = None
        if isinstance(update.error, WeightCorruption):
            # Nothing was loaded: keep serving the last good version.
            self.gate.open()
            self.engine.resume()
            log.error("%s rejected: %s", what, update.error)
            raise DataLoss(
                f"{what} rejected, nothing loaded: {update.error}; the worker keeps serving version "
                f"{self.engine.policy_version}"
            )
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
            num_bytes=int(update.stats.get("num_bytes", 0)),
            receive_s=update.stats.get("receive_s", 0.0),
            load_s=update.load_s,
            verified_buckets=int(update.stats.get("verified_buckets", 0)),
        )
