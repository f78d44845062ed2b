"""Trainer rank 0's link to the run's controller (RunService in the `rlcore launch` process):
registers, reports each step's metrics in a heartbeat, and relays what the run wants (carry on,
wait while paused, stop)."""

from __future__ import annotations

import logging
import time

from ..client.base import ClientOptions, RpcError

log = logging.getLogger("rlcore.run")

PAUSE_POLL_S = 1.0


class RunReporter:
    def __init__(self, address: str, options: ClientOptions):
        from ..client.run import RunClient

        self.client = RunClient(address, options)
        self.worker_id, _ = self.client.register_worker("trainer", index=0)
        self._pending: list = []

    def record(self, stage: str, step: int, metrics: dict[str, float]) -> None:
        from ..client.run import MetricsRecord

        self._pending.append(MetricsRecord(stage=stage, step=step, metrics=dict(metrics), time=time.time()))

    def heartbeat(
        self, stage: str, step: int, total_steps: int, policy_version: int, wait: bool = True
    ) -> str:
        """Send what was recorded; while the run is paused, keep heartbeating and wait. Returns
        'stop' when the run asks to stop, else 'go'. A controller that stopped answering is logged
        and ignored: training does not depend on it."""
        while True:  # `wait=False` only flushes the records (end of a stage)
            try:
                state = self.client.heartbeat(
                    self.worker_id, stage=stage, step=step, total_steps=total_steps,
                    policy_version=policy_version, records=self._pending,
                )  # fmt: skip
            except RpcError as e:
                log.warning("run controller unreachable (%s); carrying on", e)
                return "go"
            self._pending = []
            if state == "STOPPING":
                return "stop"
            if state != "PAUSED" or not wait:
                return "go"
            time.sleep(PAUSE_POLL_S)

    def close(self) -> None:
        self.client.close()
