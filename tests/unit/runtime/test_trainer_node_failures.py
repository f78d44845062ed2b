"""A trainer node whose share of the world failed, against RunService in process on loopback: its
heartbeat (runtime/nodes.NodeHeartbeat) tells the controller at once, for that world start only,
and waits for node 0's plan to count the restart before it joins; node 0's launcher ends its own
share of that world when it hears (launcher.wait_trainer_world)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from rlcore.core.config.schema import ControlConfig
from rlcore.core.rpc.server import ServerOptions
from rlcore.runtime.nodes import NodeHeartbeat
from rlcore.runtime.run_service import start_run_server

TOKEN = "node-heartbeat-test-token"
pytestmark = pytest.mark.timeout(60)


def _plan(path: str, address: str, restart: int) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({"run_address": address, "restart": restart}, f)
    os.replace(path + ".tmp", path)


def test_a_failed_share_reaches_the_controller_for_its_world_start_and_the_node_awaits_the_restart(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
    server, controller = start_run_server("p/r", ServerOptions(token=TOKEN), heartbeat_interval_s=5.0)
    control = ControlConfig(heartbeat_interval=5.0)
    plan = str(tmp_path / "plan.json")
    _plan(plan, server.address, 0)
    heartbeat = NodeHeartbeat(plan, control, node_rank=1)
    try:
        controller.mark_running()
        deadline = time.monotonic() + 20
        while not heartbeat.heard:
            assert time.monotonic() < deadline, "the node never registered"
            time.sleep(0.05)
        assert controller.node_failures(0) == []
        started = time.monotonic()
        assert heartbeat.failed("rank 1 was killed")  # the run goes on
        took_s = time.monotonic() - started
        assert took_s < control.heartbeat_interval - 1.0, took_s  # a heartbeat at once, not at the next interval
        assert controller.node_failures(0) == [(1, "rank 1 was killed")]
        assert controller.node_failures(1) == []  # the restarted world is not the failed one

        threading.Timer(0.5, _plan, (plan, server.address, 1)).start()  # node 0 counts the restart
        assert heartbeat.restarted(timeout_s=10) == 1
        heartbeat.joined(1)
        heartbeat.failed("")  # ... and fails again, without a line of its own
        assert controller.node_failures(1) == [(1, "its ranks exited")]

        controller.mark_failed("no restarts left")
        assert not heartbeat.failed("again")  # the controller answers that the run is over ...
        started = time.monotonic()
        assert heartbeat.restarted(timeout_s=10) is None  # ... so no restart is awaited
        assert time.monotonic() - started < 5.0  # not the 10 s
    finally:
        heartbeat.stop()
        server.stop(grace=0.5)


def test_node_0_ends_its_share_of_the_world_when_another_node_reports_its_share_failed(monkeypatch) -> None:
    """The launcher's wait for its share of the world (here a process that would sleep for a
    minute): a failure another node reports for this world start ends it at once, with a line that
    names the node; one reported for an earlier start does not."""
    import subprocess
    import sys

    from rlcore.client.base import ClientOptions
    from rlcore.client.run import RunClient
    from rlcore.runtime.launcher import wait_trainer_world

    server, controller = start_run_server("p/r", ServerOptions(token=TOKEN), heartbeat_interval_s=5.0)
    try:
        with RunClient(server.address, ClientOptions(token=TOKEN, timeout=10)) as run:
            node, _ = run.register_worker("trainer_node", index=1)
            run.heartbeat(node, world_attempt=0, world_failure="rank 1: killed")
            world = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            # start 1 of the world: the failure of start 0 is old news ... until start 1 fails too
            threading.Timer(
                1.5, run.heartbeat, (node,), {"world_attempt": 1, "world_failure": "rank 1: gone"}
            ).start()
            started = time.monotonic()
            rc, line = wait_trainer_world(world, controller, 1)
            took_s = time.monotonic() - started
        assert rc != 0 and world.poll() is not None
        assert line == "trainer node 1's share of the trainer world failed: rank 1: gone", line
        assert 1.4 < took_s < 10, took_s
    finally:
        server.stop(grace=0.5)


def test_a_killed_rank_is_named_even_when_torchrun_times_a_peers_error_first(tmp_path) -> None:
    """Rank 1 killed, rank 0 then failing in its collective: torchrun's report may call rank 0's
    error the root cause (it timed it before it noticed the kill); the line names the killed rank."""
    from rlcore.runtime import failure

    entry = "[{i}]:\n  time      : 2026-11-28_03:48:05\n  host      : h\n  rank      : {r} (local_rank: {r})\n" \
            "  exitcode  : {c} (pid: {p})\n  error_file: <N/A>\n  traceback : -\n"  # fmt: skip
    report = ("rank.py FAILED\n" + "-" * 20 + "\nFailures:\n" + entry.format(i=1, r=1, c=-9, p=222) + "-" * 20
              + "\nRoot Cause (first observed failure):\n" + entry.format(i=0, r=0, c=1, p=111))  # fmt: skip
    (tmp_path / "trainer.log").write_text(report)
    (tmp_path / "rank0.error").write_text("RuntimeError: Connection reset by peer (rank0)")
    line = failure.world_failure(str(tmp_path), str(tmp_path / "trainer.log"))
    assert line is not None and line.startswith("trainer rank 1 (pid 222) was ended by SIGKILL"), line
