"""Trainer rank 0's link to the run's controller (RunService in the `rlcore launch` process):
registers, reports each step's metrics in a heartbeat, and relays what the run wants (carry on,
wait while paused, stop)."""

from __future__ import annotations

import logging
import time

from ..client.base import ClientOptions, RpcError

log = logging.getLogger("rlcore.run")

PAUSE_POLL_S = 1.0


MAX_PENDING = 10_000
"""Records kept for a controller that does not answer (the oldest go first)."""


QUIET_MAX_FACTOR = 12
"""After failures in a row, the pause between attempts doubles from bound_s up to this many times it."""


SILENT_HEARTBEATS, MIN_SILENT_S = 3, 10.0
"""A rollout worker not heard from for this many heartbeat intervals (at least MIN_SILENT_S seconds)
is not offered to the loop."""


class RunReporter:
    """A call to the controller costs training at most `bound_s`: one attempt with that timeout,
    and after a failure none for `bound_s`, doubling with each failure in a row up to
    QUIET_MAX_FACTOR * bound_s (the records wait for the next heartbeat that gets through)."""

    def __init__(self, address: str, options: ClientOptions, bound_s: float):
        from dataclasses import replace

        from ..client.run import RunClient

        self.bound_s = bound_s
        with RunClient(address, options) as joining:  # joining may retry as usual
            self.worker_id, _ = joining.register_worker("trainer", index=0)
        self.client = RunClient(address, replace(options, timeout=bound_s, retry_attempts=1))
        self._pending: list = []
        self._quiet_until = 0.0
        self._quiet_s = bound_s

    def _unreachable(self, error: RpcError) -> None:
        log.warning("run controller unreachable (%s); carrying on, next try in %g s", error, self._quiet_s)
        self._quiet_until = time.monotonic() + self._quiet_s
        self._quiet_s = min(2 * self._quiet_s, QUIET_MAX_FACTOR * self.bound_s)

    def record(self, stage: str, step: int, metrics: dict[str, float]) -> None:
        from ..client.run import MetricsRecord

        self._pending.append(MetricsRecord(stage=stage, step=step, metrics=dict(metrics), time=time.time()))
        del self._pending[:-MAX_PENDING]

    def heartbeat(
        self, stage: str, step: int, total_steps: int, policy_version: int, wait: bool = True
    ) -> str:
        """Send what was recorded; while the run is paused, keep heartbeating and wait. Returns
        'stop' when the run asks to stop, else 'go'. A controller that stopped answering is logged
        and ignored: training does not depend on it."""
        while True:  # `wait=False` only flushes the records (end of a stage)
            if time.monotonic() < self._quiet_until:
                return "go"
            try:
                state = self.client.heartbeat(
                    self.worker_id, stage=stage, step=step, total_steps=total_steps,
                    policy_version=policy_version, records=self._pending,
                )  # fmt: skip
            except RpcError as e:
                self._unreachable(e)
                return "go"
            self._pending, self._quiet_s = [], self.bound_s
            if state == "STOPPING":
                return "stop"
            if state != "PAUSED" or not wait:
                return "go"
            time.sleep(PAUSE_POLL_S)

    def rollout_workers(self) -> list[str] | None:
        """Addresses of the rollout workers registered with the run and heard from lately (a worker
        whose heartbeats stopped, e.g. its host's link is down, is left out until they resume: the
        loop would otherwise wait for it each step), in index order; None while the controller does
        not answer (within the same bound as a heartbeat)."""
        if time.monotonic() < self._quiet_until:
            return None
        try:
            status = self.client.get_status()
        except RpcError as e:
            self._unreachable(e)
            return None
        quiet_s = max(SILENT_HEARTBEATS * self.bound_s, MIN_SILENT_S)
        return [w.address for w in status.workers if w.role == "rollout" and w.last_seen_s <= quiet_s]

    def close(self) -> None:
        self.client.close()
