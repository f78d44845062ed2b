"""Trainer rank 0's link to the run controller costs a training step at most control.heartbeat_interval
when the controller stops answering: one attempt with that deadline, then none for a while
(doubling), with the step's records kept for the next heartbeat that gets through.

The controller is a real RunService on loopback; "stops answering" is a socket on its port that
accepts connections and never speaks (a hung process), the worst case for a client."""

from __future__ import annotations

import socket
import time

import pytest

from rlcore.client.base import ClientOptions
from rlcore.core.rpc.server import ServerOptions
from rlcore.runtime.run_reporter import QUIET_MAX_FACTOR, RunReporter
from rlcore.runtime.run_service import start_run_server

TOKEN = "run-reporter-test-token"
BOUND_S = 0.5
pytestmark = pytest.mark.timeout(60)


def _timed(fn, *args, **kwargs):
    start = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - start


def test_a_silent_controller_costs_each_step_at_most_the_bound() -> None:
    server, servicer = start_run_server("proj/run", ServerOptions(token=TOKEN), heartbeat_interval_s=BOUND_S)
    port = int(server.address.rsplit(":", 1)[1])
    reporter = RunReporter(server.address, ClientOptions(token=TOKEN, timeout=5.0), bound_s=BOUND_S)
    silent = None
    try:
        reporter.record("main", 1, {"actor/loss": 0.5})
        assert reporter.heartbeat("main", 1, 10, 1) == "go"
        assert servicer.progress()[1] == 1  # the controller saw step 1
        server.stop(grace=0)
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", port))
        silent.listen(16)  # the kernel accepts; nobody answers

        costs, quiet = [], []
        for step in range(2, 40):  # a step every 50 ms for ~2 s
            reporter.record("main", step, {"actor/loss": 0.5})
            state, cost = _timed(reporter.heartbeat, "main", step, 10, step)
            assert state == "go"
            costs.append(cost)
            workers, cost = _timed(reporter.rollout_workers)
            assert workers is None
            quiet.append(cost)
            time.sleep(0.05)
        assert max(costs + quiet) < BOUND_S + 0.5, (costs, quiet)
        attempts = [c for c in costs + quiet if c > BOUND_S / 2]
        # pauses of 0.5, 1, 2 s after each failure: at most 3 attempts in ~2-5 s of steps, not one per step
        assert 1 <= len(attempts) <= 3, (costs, quiet)
        assert reporter._quiet_s <= QUIET_MAX_FACTOR * BOUND_S
        assert [r.step for r in reporter._pending] == list(range(2, 40))  # kept for the next heartbeat
    finally:
        if silent is not None:
            silent.close()
        reporter.close()


def test_a_rollout_worker_whose_heartbeats_stopped_is_left_out_until_they_resume(monkeypatch) -> None:
    from rlcore.client.run import RunClient
    from rlcore.runtime import run_reporter

    monkeypatch.setattr(run_reporter, "MIN_SILENT_S", 0.0)  # silent after 3 x BOUND_S
    server, _ = start_run_server("proj/run", ServerOptions(token=TOKEN), heartbeat_interval_s=BOUND_S)
    reporter = RunReporter(server.address, ClientOptions(token=TOKEN, timeout=5.0), bound_s=BOUND_S)
    try:
        with RunClient(server.address, ClientOptions(token=TOKEN, timeout=5.0)) as run:
            talking, _ = run.register_worker("rollout", "10.0.0.2:50051")
            silent, _ = run.register_worker("rollout", "10.0.0.3:50051")
            assert reporter.rollout_workers() == ["10.0.0.2:50051", "10.0.0.3:50051"]
            for _ in range(8):  # 2 s: four heartbeat intervals from one worker, none from the other
                run.heartbeat(talking)
                time.sleep(BOUND_S / 2)
            assert reporter.rollout_workers() == ["10.0.0.2:50051"]
            run.heartbeat(silent)  # its link is back
            assert reporter.rollout_workers() == ["10.0.0.2:50051", "10.0.0.3:50051"]
    finally:
        reporter.close()
        server.stop(grace=0)
