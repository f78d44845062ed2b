"""A trainer world across hosts: torchrun's command on each node, the nodes other than the
controller's (`rlcore launch ... cluster.node_rank=K`), and their heartbeats to the run.

Node 0 is the controller's host: it prepares the run, serves the control plane, starts or awaits
the rollout workers, hosts torchrun's rendezvous and writes the plan. Every other node runs the
same `rlcore launch` with its node rank: it starts its torchrun agent, which meets node 0's at the
rendezvous, and its ranks read the plan from the run folder, which every trainer host shares (DCP
checkpoints are written there by all ranks). Which node's rank becomes rank 0 is torchrun's choice;
rank 0 runs the loop wherever it lands (the plan holds everything it needs), and offers the rollout
workers' weight-sync group at its own node's address (MASTER_ADDR).

Each node K > 0 registers with the run's controller (role trainer_node, index K) and heartbeats;
when the trainer world fails, node 0 names the nodes that fell silent before it did (a cut link,
a host that went down), so the failure is one line that says where.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.config import Stage
from ..core.signals import StopSignals
from . import failure, fork_client
from .child import process_env, rank_threads, wrap
from .launch_plan import LaunchPlan
from .lifecycle import end_process

PLAN = "plan.json"
PLAN_POLL_S = 0.2


def node_log(cluster: Any) -> str:
    """The file of this node's torchrun (its stderr and its ranks'), in the shared launch folder."""
    return failure.TRAINER_LOG if cluster.node_rank == 0 else f"trainer.node{cluster.node_rank}.log"


def torchrun_command(plan_path: str, cluster: Any, project: str, name: str) -> list[str]:
    """torchrun starting this node's trainer ranks, as a child that dies with this process (child.py).
    A restart (trainer.max_restarts) is a new torchrun on every node, not torchrun's own
    --max-restarts: its agents keep their store, where the failed world's gloo groups left their
    addresses, and the restarted ranks dialled those and failed (torch 2.13)."""
    args = torchrun_args(cluster, f"{project}-{name}")
    return wrap(os.getpid(), "rlcore.runtime.torchrun", *args, *rank_entry("rlcore.runtime.trainer_rank", plan_path))


def rank_entry(module: str, *args: str) -> list[str]:
    """torchrun's arguments that run `module args` in each rank: `-m module args`, or, where the
    launch's fork server runs, a fork-server client that torchrun starts and watches as the rank."""
    if os.environ.get(fork_client.ENV):
        return ["--no-python", *fork_client.client_command(None, module, *args, unbuffered=True)]
    return ["-m", module, *args]


def torchrun_args(cluster: Any, rdzv_id: str) -> list[str]:
    """torchrun's flags for this node's share of a trainer world (a ClusterConfig's settings).

    Across hosts it meets the other nodes at cluster.rdzv_endpoint (c10d): node 0 hosts the
    rendezvous (is_host: torchrun's own guess compares host names, which hosts sharing a name, as
    containers and network namespaces do, get wrong), and each node gives the address the others
    reach it at (node_address)."""
    args = ["--nproc-per-node", str(cluster.ranks_per_node)]
    if cluster.num_nodes == 1 and not cluster.rdzv_endpoint:
        return [*args, "--standalone", "--nnodes", "1"]
    args += [
        "--nnodes", str(cluster.num_nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", cluster.rdzv_endpoint,
        "--rdzv-id", rdzv_id,
        "--rdzv-conf", f"is_host={int(cluster.node_rank == 0)},join_timeout={cluster.rdzv_timeout_s}",
    ]  # fmt: skip
    if cluster.node_address:
        args += ["--local-addr", cluster.node_address]
    return args


def read_plan(plan_path: str, stop: threading.Event | None = None) -> LaunchPlan | None:
    """The launch's plan once node 0 wrote it (atomically); None if `stop` is set first."""
    waiting = stop or threading.Event()
    while not os.path.exists(plan_path):
        if waiting.wait(PLAN_POLL_S):
            return None
    return LaunchPlan.read(plan_path)


class NodeHeartbeat:
    """Node K > 0 in the run's eyes: once the plan names the controller, register (role
    trainer_node, index K) and heartbeat every control.heartbeat_interval until stopped. A
    controller that does not answer is retried; the node's ranks do not depend on it."""

    def __init__(self, plan_path: str, control: Any, node_rank: int):
        self.plan_path, self.control, self.node_rank = plan_path, control, node_rank
        self.state, self.heard = "", 0.0
        """The run's state ("RUNNING", "FAILED", ...) as the controller last answered, and when."""
        self.attempt, self.failure = 0, ""
        """The world start this node takes part in, and why its share failed ("" while it runs)."""
        self._answered_from = 0.0  # when the last heartbeat that was answered was sent
        self._stop = threading.Event()
        self._wake = threading.Event()  # a heartbeat now (stop() sets it too)
        self._thread = threading.Thread(target=self._run, name="rlcore-node-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from dataclasses import replace

        from ..client.base import ClientOptions, RpcError
        from ..client.run import RunClient

        interval = self.control.heartbeat_interval
        options = replace(ClientOptions.from_control(self.control), timeout=interval, retry_attempts=1)
        complained = False
        while not self._stop.is_set():
            # the plan names the controller; one left from an earlier launch names a gone one, so
            # the plan is read again whenever the controller does not answer
            plan = read_plan(self.plan_path, self._stop)
            if plan is None:
                return
            worker_id = None
            with RunClient(str(plan.run_address), options) as run:
                while not self._stop.is_set():
                    try:
                        if worker_id is None:
                            worker_id, _ = run.register_worker("trainer_node", index=self.node_rank)
                        sent = time.monotonic()
                        state = run.heartbeat(
                            worker_id, world_attempt=self.attempt, world_failure=self.failure
                        )
                        self.state, self.heard, self._answered_from = state, time.monotonic(), sent
                        complained = False
                    except RpcError as e:
                        if not complained:
                            print(
                                f"rlcore: the run's controller does not answer ({e}); trying on", flush=True
                            )
                            complained = True
                        self._stop.wait(interval)
                        break
                    self._wake.wait(interval)
                    self._wake.clear()

    def joined(self, attempt: int) -> None:
        self.attempt, self.failure = attempt, ""

    def failed(self, line: str) -> bool:
        """This node's share of the world failed: tell the controller (node 0 then ends its share
        at once: its ranks may wait in a collective with this node's dead ones until
        cluster.collective_timeout_s), and answer whether the run is still on (node 0 restarts the
        world when it restarts at all), as the controller answers within two heartbeats from now."""
        self.failure = line or "its ranks exited"
        asked = time.monotonic()
        self._wake.set()
        deadline = asked + 2 * self.control.heartbeat_interval + 1.0
        while time.monotonic() < deadline and self._answered_from < asked:
            time.sleep(0.05)
        return self._answered_from >= asked and self.state in ("STARTING", "RUNNING", "PAUSED")

    def restarted(self, timeout_s: float) -> int | None:
        """After a failure: the next world start, once node 0's plan counts it (node 0 has ended its
        share of the failed world by then, and its rendezvous is the new world's); None if the run
        ends, or no restart comes within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.run_ended():
            try:
                attempt = LaunchPlan.read(self.plan_path).restart
            except (OSError, ValueError):
                attempt = self.attempt
            if attempt > self.attempt:
                return attempt
            time.sleep(PLAN_POLL_S)
        return None

    def run_ended(self) -> bool:
        return self.state in ("FINISHED", "FAILED")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5.0)


def silent_nodes(controller: Any, control: Any) -> str:
    """The trainer nodes whose heartbeats stopped (more than two intervals ago), as the start of
    the line that reports a failed world; empty when every node was heard from."""
    quiet = sorted(controller.silent("trainer_node", 2 * control.heartbeat_interval))
    if not quiet:
        return ""
    named = ", ".join(f"node {index} ({age:.0f} s ago)" for index, _, age in quiet)
    return (
        f"trainer {named} stopped answering the controller (its link or host is down?), and the trainer world "
        "failed: "
    )


def join_world(stages: list[Stage], device: str, run_dir: str) -> int:
    """`rlcore launch` on trainer node K > 0: run this node's share of the trainer world until it
    ends; its ranks take the plan node 0 writes into the shared run folder."""
    base = stages[0].config
    cluster = base.cluster
    launch_dir = os.path.join(run_dir, "launch")
    os.makedirs(launch_dir, exist_ok=True)
    plan_path = os.path.join(launch_dir, PLAN)
    threads = rank_threads(cluster)
    command = torchrun_command(plan_path, cluster, base.project, base.name)
    log_path = os.path.join(launch_dir, node_log(cluster))
    print(
        f"rlcore: trainer node {cluster.node_rank} of {cluster.num_nodes}: {cluster.ranks_per_node} rank(s) on "
        f"{device} meet node 0 at {cluster.rdzv_endpoint}; run folder {run_dir} (shared by the trainer hosts); "
        f"log {log_path}",
        flush=True,
    )
    heartbeat = NodeHeartbeat(plan_path, base.control, cluster.node_rank)
    stops = StopSignals(at_once=True, signals=(signal.SIGTERM,)).install()  # as Ctrl-C: ends the ranks below
    attempt = 0
    try:
        while True:
            heartbeat.joined(attempt)
            log_start = log_size(log_path)
            world = start_world(command, process_env(cluster, threads), log_path)
            try:
                rc = _wait_world(world, heartbeat, cluster)
            except KeyboardInterrupt:
                print(
                    f"rlcore: trainer node {cluster.node_rank}: interrupted; ending its ranks",
                    file=sys.stderr,
                )
                end_process(world)
                return 130
            if rc == 0:
                break
            line = failure.world_failure(launch_dir, log_path, log_start) or f"its output is in {log_path}"
            # node 0 restarts the world (trainer.max_restarts) while the run goes on: join it again
            if not heartbeat.failed(line) or attempt >= base.trainer.max_restarts:
                break
            print(
                f"rlcore: trainer node {cluster.node_rank}: the trainer world failed ({line}); waiting for its restart",
                flush=True,
            )
            next_attempt = heartbeat.restarted(cluster.rdzv_timeout_s)
            if next_attempt is None:
                break
            attempt = next_attempt
            print(f"rlcore: trainer node {cluster.node_rank}: joining restart {attempt}", flush=True)
    finally:
        stops.restore()
        heartbeat.stop()
    if rc == 0:
        print(f"rlcore: trainer node {cluster.node_rank}: the trainer world finished", flush=True)
        return 0
    print(
        f"rlcore: error: trainer node {cluster.node_rank}: the trainer world exited with code {rc}: {line}",
        file=sys.stderr,
    )
    return rc


def _wait_world(world: subprocess.Popen, heartbeat: NodeHeartbeat, cluster: Any) -> int:
    """The world's exit code, watched (`watch_node`) by the run controller's answers to this node's
    heartbeats, within cluster.collective_timeout_s."""
    rc, _ = watch_node(
        world, cluster.node_rank, lambda: heartbeat.heard, cluster.collective_timeout_s,
        lambda silent_s: (
            f"the run's controller has not answered for {silent_s:.0f} s (cluster.collective_timeout_s): this "
            "host's link or node 0 is down"
        ),
        run_ended=heartbeat.run_ended,
    )  # fmt: skip
    return rc


def watch_node(
    world: subprocess.Popen, node_rank: int, heard: Callable[[], float], limit_s: float,
    lost: Callable[[float], str], run_ended: Callable[[], bool] = lambda: False, poll_s: float = 1.0,
    grace_s: float = 30.0, end_grace_s: float = 5.0,
) -> tuple[int, str]:  # fmt: skip
    """Trainer node K > 0 (`rlcore launch` and `rlcore trainer serve` alike) waiting for its share of
    the world: the world's exit code, and why this node ended it ("" if it ended by itself).

    Its ranks wait for rank 0's next command without a timeout, and torchrun's agent does not notice a
    cut (seen: still waiting 200 s after one, torch 2.13). So once node 0 was heard from (`heard()`:
    when it last answered, monotonic, 0 before the first answer; until then node 0 may still be
    starting and torchrun's rendezvous timeout bounds the wait) and has been silent for more than
    `limit_s`, this node ends its ranks, saying `lost(silent_s)`. A world that outlives its run
    (`run_ended()`) by `grace_s` waits at a rendezvous node 0 will not come to: it is ended too.
    A world ended for either reason cannot end in order: its agent's next call to node 0's
    rendezvous store blocks (seen: 30 s after the SIGTERM, until it was killed), so it is killed
    `end_grace_s` after the SIGTERM, its ranks with it."""
    ended_at = None
    while True:
        try:
            return world.wait(timeout=poll_s), ""
        except subprocess.TimeoutExpired:
            pass
        last = heard()
        silent_s = time.monotonic() - last
        if last and silent_s > limit_s:
            why = lost(silent_s)
            print(f"rlcore: trainer node {node_rank}: {why}; ending this node's ranks", file=sys.stderr, flush=True)
            end_process(world, grace_s=end_grace_s)
            return world.returncode or 1, why
        if run_ended():
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > grace_s:
                end_process(world, grace_s=end_grace_s)
                return world.returncode or 1, ""


def log_size(path: str) -> int:
    """Where a world started now begins writing in `path` (torchrun's log, appended to)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def start_world(
    command: list[str], env: dict[str, str], log_path: str, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen:
    """torchrun in a session of its own (a terminal's Ctrl-C reaches only the launcher, which ends
    the run in order), dying with the launcher, its stderr and the ranks' (tracebacks, torchrun's
    failure report) appended to `log_path`."""
    with open(log_path, "a") as log:
        return subprocess.Popen(command, env=env, stderr=log, start_new_session=True, pass_fds=pass_fds)
