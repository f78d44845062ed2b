"""More than one host, on one machine: network namespaces joined by a bridge (netns.py) play the
hosts, each with its own address. Trainer node 0 (the controller's host), trainer node 1 and a
rollout host run the same commands users run on a cluster (docs/multi-host.md):

    node 0:        rlcore launch cfg.yaml cluster.node_address=<its address>
    node 1:        rlcore launch cfg.yaml cluster.node_rank=1 cluster.node_address=<its address>
    rollout host:  rlcore rollout serve --model ... --host <its address> --register <node 0>:<run_port>

with mutual TLS and the run's token on every link. Skipped, with the reason, where namespaces
cannot be made (not root)."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.integration import netns
from tests.integration.launch_utils import REPO
from tests.integration.quickstart_runs import (
    RL_STEPS,
    SFT_STEPS,
    logged,
    metrics,
    quickstart,
    same_steps,
    same_training,
    trainer_rank,
)

SKIP = netns.skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

TOKEN = "multi-host-test-token"
RDZV_PORT, RUN_PORT, TRAINER_PORT = 29531, 29532, 29533


def _pki(folder: str, hosts: list[str]) -> dict:
    """A CA and one certificate for every host address (servers and, mutual TLS, clients)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=rlcore-test-ca")  # fmt: skip
    with open(os.path.join(folder, "san.ext"), "w") as f:
        f.write("subjectAltName=" + ",".join(f"IP:{h}" for h in [*hosts, "127.0.0.1"]) + "\n")
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "host.key", "-out", "host.csr", "-subj", "/CN=host"
    )
    openssl("x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "host.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return {
        "enabled": True, "cert_file": os.path.join(folder, "host.pem"), "key_file": os.path.join(folder, "host.key"),
        "ca_file": os.path.join(folder, "ca.pem"), "require_client_cert": True,
    }  # fmt: skip


class Cluster:
    """The roles of one run started in their hosts, their output in `folder`."""

    def __init__(self, hosts: list[netns.Host], folder: str):
        self.hosts, self.folder = hosts, folder
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, RLCORE_TOKEN=TOKEN, GLOO_SOCKET_IFNAME="eth0")

    def start(self, role: str, host: netns.Host, argv: list[str]) -> subprocess.Popen:
        out = open(os.path.join(self.folder, f"{role}.out"), "w")
        proc = host.popen([sys.executable, "-m", "rlcore.cli", *argv], cwd=REPO, env=self.env, stdout=out,
                          stderr=subprocess.STDOUT)  # fmt: skip
        self.procs[role] = proc
        return proc

    def start_trainer_nodes(self, config: str) -> None:
        """`rlcore launch` on the first two hosts: node 0, and node 1 joining it."""
        node0, node1 = self.hosts[:2]
        self.start("node0", node0, ["launch", config, f"cluster.node_address={node0.address}"])
        self.start(
            "node1", node1, ["launch", config, "cluster.node_rank=1", f"cluster.node_address={node1.address}"]
        )

    def output(self, role: str) -> str:
        with open(os.path.join(self.folder, f"{role}.out")) as f:
            return f.read()

    def report(self) -> str:
        return "\n".join(f"--- {role}:\n{self.output(role)[-4000:]}" for role in self.procs)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait_for(condition, what: str, cluster: Cluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s:.0f} s\n{cluster.report()}")
        time.sleep(0.2)


def start_rollout_host(
    cluster: Cluster, host: netns.Host, node0: netns.Host, cfg: dict, tls: dict | None, role: str = "rollout"
) -> None:
    """`rlcore rollout serve` on the rollout host, joining the run at node 0 once the model exists
    (node 0 prepares the run's assets), with the flags a launch gives the workers it starts."""
    model = cfg["model"]["model_path"]
    _wait_for(
        lambda: os.path.exists(os.path.join(model, "config.json")), "node 0 prepared the model", cluster, 120
    )
    cluster.start(role, host, [
        "rollout", "serve", "--model", model, "--engine", "hf", "--device", "cpu", "--dtype", "auto",
        "--max-model-len", str(cfg["model"]["max_model_len"]), "--max-batch-size", "256", "--seed", str(cfg["seed"]),
        "--threads", "2", "--host", host.address, "--port", "0", "--register", f"{node0.address}:{RUN_PORT}",
        "--token-env", "RLCORE_TOKEN", *_tls_flags(tls),
    ])  # fmt: skip


def _tls_flags(tls: dict | None) -> list[str]:
    """A server's flags for the run's control.tls (mutual TLS)."""
    if tls is None:
        return []
    return [
        "--tls-cert", tls["cert_file"], "--tls-key", tls["key_file"], "--tls-ca", tls["ca_file"],
        "--tls-require-client-cert",
    ]  # fmt: skip


def multi_host_config(cfg: dict, node0: netns.Host, tls: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["cluster"].update(
        num_nodes=2, ranks_per_node=1, rdzv_endpoint=f"{node0.address}:{RDZV_PORT}", rdzv_timeout_s=60
    )
    cfg["control"] = {"host": node0.address, "run_port": RUN_PORT, "heartbeat_interval": 1.0, "tls": tls}
    cfg["explorer"] = {"rollout_model": {"start_workers": False}}
    return cfg


def _config_file(cfg: dict, folder: str) -> str:
    path = os.path.join(folder, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def test_two_trainer_hosts_and_a_rollout_host_train_the_quickstart_as_one_host_does(
    tmp_path, one_host
) -> None:
    """The quickstart's two stages (SFT warm-up, then GRPO with a rollout worker) on a trainer
    world across two hosts and a worker on a third give the same per-step losses, gradient norms
    and rewards as on one host (two ranks, a worker the launch starts), with the same seed; every
    link (gRPC, rendezvous, the world's and the weight sync's gloo) crosses the bridge, the gRPC
    ones under mutual TLS."""
    pki = tmp_path / "pki"
    pki.mkdir()
    with netns.Hosts(3) as hosts:
        node0, _, rollout_host = hosts
        tls = _pki(str(pki), [h.address for h in hosts])
        multi = multi_host_config(quickstart(str(tmp_path / "multi"), SFT_STEPS, RL_STEPS), node0, tls)
        path = _config_file(multi, str(tmp_path))
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start_trainer_nodes(path)
            start_rollout_host(cluster, rollout_host, node0, multi, tls)
            assert cluster.procs["node0"].wait(timeout=600) == 0, cluster.report()
            assert cluster.procs["node1"].wait(timeout=60) == 0, cluster.report()
        finally:
            cluster.close()
        assert f"rollout workers ready: {rollout_host.address}:" in cluster.output("node0")
        assert "trainer node 1: the trainer world finished" in cluster.output("node1")
    same_training(one_host, os.path.join(multi["checkpoint_root_dir"], "quickstart", "arithmetic"))


def test_a_trainer_service_across_two_hosts_trains_the_quickstart_as_one_host_does(
    tmp_path, one_host
) -> None:
    """`rlcore trainer serve` on two hosts (node 0's first rank serves TrainerService under mutual
    TLS, though torchrun's rendezvous ranks node 1 first), driven from a third host by a launch with
    trainer.remote whose rollout worker pulls the weights from node 0: the quickstart trains to the
    same per-step losses, gradient norms and rewards as on one host. Node 0's SIGTERM ends both."""
    pki = tmp_path / "pki"
    pki.mkdir()
    with netns.Hosts(3) as hosts:
        node1, node0, driver = hosts  # node 1's address sorts first: torchrun's rendezvous ranks it first
        tls = _pki(str(pki), [h.address for h in hosts])
        cfg = quickstart(str(tmp_path / "remote"), SFT_STEPS, RL_STEPS)
        cfg["trainer"]["remote"] = f"{node0.address}:{TRAINER_PORT}"
        cfg["control"] = {"host": driver.address, "tls": tls}
        path = _config_file(cfg, str(tmp_path))
        serve = [
            "trainer", "serve", "--ranks", "1", "--threads", "2", "--device", "cpu", "--nnodes", "2",
            "--rdzv-endpoint", f"{node0.address}:{RDZV_PORT}", "--rdzv-timeout", "60", *_tls_flags(tls),
        ]  # fmt: skip
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start("serve1", node1, [*serve, "--node-rank", "1", "--node-address", node1.address])
            cluster.start("serve0", node0, [
                *serve, "--node-rank", "0", "--node-address", node0.address, "--host", node0.address,
                "--port", str(TRAINER_PORT),
            ])  # fmt: skip
            _wait_for(
                lambda: "trainer serving on" in cluster.output("serve0"), "node 0 serving", cluster, 120
            )
            cluster.start("launch", driver, ["launch", path])
            assert cluster.procs["launch"].wait(timeout=600) == 0, cluster.report()
            cluster.procs["serve0"].send_signal(signal.SIGTERM)
            assert cluster.procs["serve0"].wait(timeout=60) == 0, cluster.report()
            assert cluster.procs["serve1"].wait(timeout=60) == 0, cluster.report()
        finally:
            cluster.close()
    assert f"trainer serving on {node0.address}:{TRAINER_PORT} (2 rank(s) on 2 nodes, cpu)" in cluster.output(
        "serve0"
    )
    assert f"remote trainer {node0.address}:{TRAINER_PORT}: 2 rank(s)" in cluster.output("launch")
    assert "trainer node 1: the trainer world finished" in cluster.output("serve1")
    same_training(one_host, os.path.join(cfg["checkpoint_root_dir"], "quickstart", "arithmetic"))


def test_a_trainer_service_node_cut_off_ends_its_ranks_in_one_line(tmp_path) -> None:
    """Node 1's link cut under an idle `rlcore trainer serve` world: its ranks would wait for rank
    0's next command for days (torchrun's agent does not notice), so node 1 ends them once node 0's
    rendezvous has not answered for --collective-timeout, in one line, and leaves no process. Node 1
    starts first and node 0 only after more than --collective-timeout: a node 0 that has never
    answered is still starting, not lost (a busy machine's healthy start was taken for a cut)."""
    with netns.Hosts(2) as hosts:
        node0, node1 = hosts
        serve = [
            "trainer", "serve", "--ranks", "1", "--threads", "1", "--device", "cpu", "--nnodes", "2",
            "--rdzv-endpoint", f"{node0.address}:{RDZV_PORT}", "--rdzv-timeout", "60", "--collective-timeout", "5",
        ]  # fmt: skip
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start("serve1", node1, [*serve, "--node-rank", "1", "--node-address", node1.address])
            time.sleep(8)  # past --collective-timeout before node 0 exists
            assert cluster.procs["serve1"].poll() is None, cluster.report()
            cluster.start("serve0", node0, [*serve, "--node-address", node0.address, "--host", node0.address])
            _wait_for(
                lambda: "trainer serving on" in cluster.output("serve0"), "node 0 serving", cluster, 120
            )
            node1.cut()
            cut_at = time.monotonic()
            assert cluster.procs["serve1"].wait(timeout=120) == 1, cluster.report()
            took_s = time.monotonic() - cut_at
            _wait_for(lambda: not node1.pids(), "node 1's processes gone", cluster, 30)
        finally:
            cluster.close()
    errors = [line for line in cluster.output("serve1").splitlines() if line.startswith("rlcore: error:")]
    assert len(errors) == 1, cluster.report()
    assert f"node 0's rendezvous {node0.address}:{RDZV_PORT} has not answered for" in errors[0], errors
    assert 5 < took_s < 45, took_s


def _two_nodes(tmp_path, **settings) -> tuple[dict, str]:
    """The multi-host quickstart whose rollout worker node 0's launch starts (it outlives the world's
    restarts), checkpointing every 2 steps."""
    cfg = quickstart(str(tmp_path / "multi"), SFT_STEPS, RL_STEPS)
    cfg["cluster"].update(
        num_nodes=2, ranks_per_node=1, rdzv_endpoint=f"10.77.0.1:{RDZV_PORT}", rdzv_timeout_s=60
    )
    cfg["control"] = {"host": "10.77.0.1", "heartbeat_interval": 1.0}
    cfg["trainer"].update(save_interval=2, **settings)
    return cfg, os.path.join(cfg["checkpoint_root_dir"], "quickstart", "arithmetic")


def test_a_trainer_world_restarts_across_hosts_and_trains_no_step_twice(tmp_path, one_host) -> None:
    """trainer.max_restarts across hosts: node 1's rank killed mid-GRPO fails the world; node 0's
    launch starts it again, node 1's joins the restart, and the ranks resume from the last
    checkpoint (every 2 steps) with the rollout worker that kept running; the run then matches the
    one-host run step for step, each step logged once."""
    cfg, run_dir = _two_nodes(tmp_path, max_restarts=1)
    path = _config_file(cfg, str(tmp_path))
    with netns.Hosts(2) as hosts:
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start_trainer_nodes(path)
            _wait_for(lambda: logged(run_dir, "stage1_rl", 3), "GRPO step 3", cluster, 300)
            trainer_rank(cfg["checkpoint_root_dir"], 1).kill()
            assert cluster.procs["node0"].wait(timeout=600) == 0, cluster.report()
            assert cluster.procs["node1"].wait(timeout=60) == 0, cluster.report()
        finally:
            cluster.close()
    out = cluster.output("node0")
    assert "restart 1 of 1 (trainer.max_restarts) from the last checkpoint" in out, out
    assert "trainer world restart 1 of 1 (trainer.max_restarts): resuming from the last checkpoint" in out, (
        out
    )
    assert out.count("rollout workers ready") == 1  # the worker served both worlds
    assert "trainer node 1: the trainer world failed" in cluster.output("node1")
    assert "trainer node 1: joining restart 1" in cluster.output("node1")
    same_training(one_host, run_dir)


def test_a_trainer_node_cut_off_ends_the_run_naming_it_and_the_run_resumes(tmp_path, one_host) -> None:
    """Node 1's link cut mid-GRPO: the world's next collective (or rank 0's next command) times out
    (cluster.collective_timeout_s), and the launch ends with one line naming node 1; node 1, which
    no longer hears the controller, ends its ranks instead of waiting for a command that never
    comes. With the link back, both nodes launched again with continue_from_checkpoint resume and
    finish as the one-host run did, step for step."""
    cfg, run_dir = _two_nodes(tmp_path)
    cfg["cluster"]["collective_timeout_s"] = 10
    path = _config_file(cfg, str(tmp_path))
    with netns.Hosts(2) as hosts:
        node0, node1 = hosts
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start_trainer_nodes(path)
            _wait_for(lambda: logged(run_dir, "stage1_rl", 3), "GRPO step 3", cluster, 300)
            node1.cut()
            assert cluster.procs["node0"].wait(timeout=120) != 0, cluster.report()
            errors = [
                line for line in cluster.output("node0").splitlines() if line.startswith("rlcore: error:")
            ]
            assert len(errors) == 1, cluster.report()
            assert "trainer node 1 (" in errors[0] and "stopped answering the controller" in errors[0], errors
            assert cluster.procs["node1"].wait(timeout=120) != 0, cluster.report()
            assert "the run's controller has not answered" in cluster.output("node1")
            node1.restore()
            resume = "continue_from_checkpoint=true"
            cluster.start(
                "node0 again", node0, ["launch", path, f"cluster.node_address={node0.address}", resume]
            )
            cluster.start("node1 again", node1, [
                "launch", path, "cluster.node_rank=1", f"cluster.node_address={node1.address}", resume,
            ])  # fmt: skip
            assert cluster.procs["node0 again"].wait(timeout=300) == 0, cluster.report()
            assert cluster.procs["node1 again"].wait(timeout=60) == 0, cluster.report()
        finally:
            cluster.close()
    same_training(one_host, run_dir)


def test_a_rollout_host_cut_off_is_left_out_and_rejoins_when_its_link_returns(tmp_path, one_host) -> None:
    """Two rollout hosts; one's link cut mid-GRPO: its share of the batch goes to the other (a seeded
    prompt samples the same on either), the weight sync goes on without it, and its silent
    heartbeats keep it out of the next steps; once its link returns it rejoins with the current
    weights. Every step is trained once, the first ones with the numbers of the one-host run (one
    worker; the learning rate is constant, so a longer run starts the same). The run is stopped as a
    user's Ctrl-C stops it once the returned worker has served a step: its steps are planned long
    enough for the return (it is tried again RETRY_UNREACHABLE_S, 5 s, after it last failed to
    answer, whatever the steps take), not to be all trained."""
    rl_steps = 200
    cfg = quickstart(str(tmp_path / "multi"), SFT_STEPS, rl_steps)
    cfg["cluster"]["ranks_per_node"] = 2  # as the one-host run
    cfg["control"] = {"host": "10.77.0.1", "run_port": RUN_PORT, "heartbeat_interval": 1.0}
    cfg["explorer"] = {"rollout_model": {"start_workers": False, "engine_num": 2}, "max_timeout": 10}
    cfg["synchronizer"] = {"sync_timeout": 6}
    run_dir = os.path.join(cfg["checkpoint_root_dir"], "quickstart", "arithmetic")
    path = _config_file(cfg, str(tmp_path))
    with netns.Hosts(3) as hosts:
        node0, steady, cut = hosts
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start("node0", node0, ["launch", path, f"cluster.node_address={node0.address}"])
            start_rollout_host(cluster, steady, node0, cfg, None, role="steady")
            start_rollout_host(cluster, cut, node0, cfg, None, role="cut")
            _wait_for(lambda: logged(run_dir, "stage1_rl", 2), "GRPO step 2", cluster, 300)
            cut.cut()
            left_out = re.compile(rf"rollout workers now: {steady.address}:\d+ \(were: .*{cut.address}:")
            _wait_for(
                lambda: left_out.search(cluster.output("node0")), "the cut worker left out", cluster, 120
            )
            cut.restore()
            back = re.compile(rf"rollout workers now: .*{cut.address}:\d+.* \(were: {steady.address}:\d+\)")
            _wait_for(lambda: back.search(cluster.output("node0")), "the cut worker back", cluster, 120)
            back_at = len(metrics(run_dir, "stage1_rl"))
            # a step served by the returned worker, and the one-host run's steps
            last = max(back_at + 2, RL_STEPS)
            _wait_for(lambda: logged(run_dir, "stage1_rl", last), "a step after the return", cluster, 120)
            cluster.procs["node0"].send_signal(signal.SIGINT)
            assert cluster.procs["node0"].wait(timeout=300) == 128 + signal.SIGINT, cluster.report()
        finally:
            cluster.close()
    out = cluster.output("node0")
    # the cut is met by the step's rollout or by the sync after it: either names the worker and the call
    named = rf"rollout worker {cut.address}:\d+: (RunTasks: DEADLINE_EXCEEDED.*its tasks go to the other|\w+: DEADLINE_EXCEEDED)"
    assert re.search(named, out), out
    assert back.search(out[left_out.search(out).end() :]), out
    rl = metrics(run_dir, "stage1_rl")
    assert [r["step"] for r in rl] == list(range(1, len(rl) + 1))
    assert last <= len(rl) < rl_steps, len(rl)
    same_steps(
        metrics(one_host, "stage1_rl"),
        rl[:RL_STEPS],
        ("rollout/reward_mean", "actor/loss", "actor/grad_norm"),
    )


def test_a_rollout_host_cut_mid_transfer_fails_the_sync_naming_it_and_the_phase_then_syncs_again(
    tmp_path, tiny_model_path
) -> None:
    """A weight sync from a trainer host to a rollout host whose link is cut between two buckets
    of the transfer: a WeightSyncError naming the worker and the phase within about
    synchronizer.sync_timeout, never a hang; with the link back, a new sync group forms with the
    same worker process and the next version arrives."""
    timeout_s = 5.0
    with netns.Hosts(2) as hosts:
        trainer_host, rollout_host = hosts
        cluster = Cluster(hosts, str(tmp_path))
        port_file = str(tmp_path / "worker.address")
        sender = None
        try:
            cluster.start("rollout", rollout_host, [
                "rollout", "serve", "--model", tiny_model_path, "--max-model-len", "256", "--threads", "1",
                "--host", rollout_host.address, "--port", "0", "--port-file", port_file, "--token-env", "RLCORE_TOKEN",
            ])  # fmt: skip
            _wait_for(lambda: os.path.exists(port_file), "the worker serving", cluster, 120)
            address = open(port_file).read().strip()
            sender = trainer_host.popen(
                [sys.executable, "-m", "tests.integration.netns_sync_sender", tiny_model_path, address,
                 trainer_host.address, str(timeout_s)],
                cwd=REPO, env=cluster.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert sender.stdout.readline() == "synced 1\n"
            assert sender.stdout.readline() == "paused\n"
            rollout_host.cut()
            sender.stdin.write("go\n")
            sender.stdin.flush()
            error = sender.stdout.readline()
            rollout_host.restore()
            sender.stdin.write("again\n")
            sender.stdin.flush()
            assert sender.stdout.readline() == "synced 3\n", cluster.report()
            assert sender.wait(timeout=60) == 0
        finally:
            if sender is not None and sender.poll() is None:
                sender.kill()
                sender.wait()
            cluster.close()
    took = re.match(r"error after ([\d.]+) s: ", error)
    assert took and f"rollout worker {address}" in error and " in phase " in error, error
    assert float(took.group(1)) < 3 * timeout_s, error


def test_a_resumed_controller_takes_back_the_rollout_host_that_kept_running(tmp_path, one_host) -> None:
    """Node 0's launch killed with -9 mid-GRPO (its controller, trainer world and all): the rollout
    host keeps serving; the launch started again with continue_from_checkpoint on the same run port
    is joined again by that worker (its heartbeat finds itself unknown and registers anew), and the
    run finishes as the one-host run did, step for step."""
    cfg = quickstart(str(tmp_path / "multi"), SFT_STEPS, RL_STEPS)
    cfg["cluster"]["ranks_per_node"] = 2  # as the one-host run
    cfg["control"] = {"host": "10.77.0.1", "run_port": RUN_PORT, "heartbeat_interval": 1.0}
    cfg["explorer"] = {"rollout_model": {"start_workers": False}}
    cfg["trainer"] = {**cfg["trainer"], "save_interval": 2}
    run_dir = os.path.join(cfg["checkpoint_root_dir"], "quickstart", "arithmetic")
    path = _config_file(cfg, str(tmp_path))
    with netns.Hosts(2) as hosts:
        node0, rollout_host = hosts
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start("node0", node0, ["launch", path, f"cluster.node_address={node0.address}"])
            start_rollout_host(cluster, rollout_host, node0, cfg, None)
            _wait_for(lambda: logged(run_dir, "stage1_rl", 3), "GRPO step 3", cluster, 300)
            cluster.procs["node0"].kill()
            cluster.procs["node0"].wait()
            cluster.start("node0 again", node0, [
                "launch", path, f"cluster.node_address={node0.address}", "continue_from_checkpoint=true",
            ])  # fmt: skip
            assert cluster.procs["node0 again"].wait(timeout=300) == 0, cluster.report()
            assert cluster.procs["rollout"].poll() is None, cluster.report()  # the same worker all along
        finally:
            cluster.close()
    assert "started again; joined it as rollout-0" in cluster.output("rollout"), cluster.report()
    assert f"rollout workers ready: {rollout_host.address}:" in cluster.output("node0 again")
    same_training(one_host, run_dir)
