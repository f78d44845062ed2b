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


class RunReporter:
    """A heartbeat costs training at most `bound_s`: one attempt with that timeout, and after a
    failure none for `bound_s` (the records wait for the next one that gets through)."""

    def __init__(self, address: str, options: ClientOptions, bound_s: float):
        from dataclasses import replace

        from ..client.run import RunClient

        self.bound_s = bound_s
        with RunClient(address, options) as joining:  # joining may retry as usual
            self.worker_id, _ = joining.register_worker("trainer", index=0)
        self.client = RunClient(address, replace(options, timeout=bound_s, retry_attempts=1))
        self._pending: list = []
        self._quiet_until = 0.0

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
                log.warning("run controller unreachable (%s); carrying on, next try in %g s", e, self.bound_s)
                self._quiet_until = time.monotonic() + self.bound_s
                return "go"
            self._pending = []
            if state == "STOPPING":
                return "stop"
            if state != "PAUSED" or not wait:
                return "go"
            time.sleep(PAUSE_POLL_S)

    def rollout_workers(self) -> list[str]:
        """Addresses of the rollout workers registered with the run now, in index order."""
        status = self.client.get_status()
        return [w.address for w in status.workers if w.role == "rollout"]

    def close(self) -> None:
        self.client.close()
