"""More than one host, on one machine: network namespaces joined by a bridge (netns.py) play the
hosts, each with its own address. Trainer node 0 (the controller's host), trainer node 1 and a
rollout host run the same commands users run on a cluster (README "Several hosts"):

    node 0:        rlcore launch cfg.yaml cluster.node_address=<its address>
    node 1:        rlcore launch cfg.yaml cluster.node_rank=1 cluster.node_address=<its address>
    rollout host:  rlcore rollout serve --model ... --host <its address> --register <node 0>:<run_port>

with mutual TLS and the run's token on every link. Skipped, with the reason, where namespaces
cannot be made (not root)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from tests.integration import netns
from tests.integration.launch_utils import REPO, launch

SKIP = netns.skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

TOKEN = "multi-host-test-token"
RDZV_PORT, RUN_PORT = 29531, 29532


def quickstart(root: str, sft_steps: int, rl_steps: int) -> dict:
    """configs/quickstart.yaml, shortened: its SFT warm-up for `sft_steps`, then its GRPO stage
    for `rl_steps`, without evaluation; one rank per trainer node, two threads per process."""
    with open(os.path.join(REPO, "configs", "quickstart.yaml")) as f:
        cfg = yaml.safe_load(
            f.read().replace("${checkpoint_root_dir}", root)
        )  # paths for the rollout host too
    cfg["checkpoint_root_dir"] = root
    cfg["cluster"].update(threads_per_rank=2)
    del cfg["buffer"]["explorer_input"]["eval_tasksets"]
    sft, rl = cfg["stages"]
    sft["buffer"]["total_steps"] = sft_steps
    rl["buffer"]["total_steps"] = rl_steps
    rl["explorer"] = {"eval_on_startup": False, "eval_interval": 0}
    return cfg


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


def _metrics(run_dir: str, stage: str) -> list[dict]:
    with open(os.path.join(run_dir, stage, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _same_steps(one: list[dict], other: list[dict], keys: tuple[str, ...]) -> None:
    assert [r["step"] for r in one] == [r["step"] for r in other]
    for a, b in zip(one, other, strict=True):
        for key in keys:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])


class Cluster:
    """The roles of one run started in their hosts, their output in `folder`."""

    def __init__(self, hosts: list[netns.Host], folder: str):
        self.hosts, self.folder = hosts, folder
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, RLCORE_TOKEN=TOKEN, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=REPO)

    def start(self, role: str, host: netns.Host, argv: list[str]) -> subprocess.Popen:
        out = open(os.path.join(self.folder, f"{role}.out"), "w")
        proc = host.popen([sys.executable, "-m", "rlcore.cli", *argv], cwd=REPO, env=self.env, stdout=out,
                          stderr=subprocess.STDOUT)  # fmt: skip
        self.procs[role] = proc
        return proc

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


def start_rollout_host(cluster: Cluster, host: netns.Host, node0: netns.Host, cfg: dict, tls: dict) -> None:
    """`rlcore rollout serve` on the rollout host, joining the run at node 0 once the model exists
    (node 0 prepares the run's assets), with the flags a launch gives the workers it starts."""
    model = cfg["model"]["model_path"]
    _wait_for(
        lambda: os.path.exists(os.path.join(model, "config.json")), "node 0 prepared the model", cluster, 120
    )
    cluster.start("rollout", host, [
        "rollout", "serve", "--model", model, "--engine", "hf", "--device", "cpu", "--dtype", "auto",
        "--max-model-len", str(cfg["model"]["max_model_len"]), "--max-batch-size", "256", "--seed", str(cfg["seed"]),
        "--threads", "2", "--host", host.address, "--port", "0", "--register", f"{node0.address}:{RUN_PORT}",
        "--token-env", "RLCORE_TOKEN", "--tls-cert", tls["cert_file"], "--tls-key", tls["key_file"],
        "--tls-ca", tls["ca_file"], "--tls-require-client-cert",
    ])  # fmt: skip


def multi_host_config(cfg: dict, node0: netns.Host, tls: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["cluster"].update(
        num_nodes=2, ranks_per_node=1, rdzv_endpoint=f"{node0.address}:{RDZV_PORT}", rdzv_timeout_s=60
    )
    cfg["control"] = {"host": node0.address, "run_port": RUN_PORT, "heartbeat_interval": 1.0, "tls": tls}
    cfg["explorer"] = {"rollout_model": {"start_workers": False}}
    return cfg


def test_two_trainer_hosts_and_a_rollout_host_train_the_quickstart_as_one_host_does(tmp_path) -> None:
    """The quickstart's two stages (SFT warm-up, then GRPO with a rollout worker) on a trainer
    world across two hosts and a worker on a third give the same per-step losses, gradient norms
    and rewards as on one host (two ranks, a worker the launch starts), with the same seed."""
    base = quickstart(str(tmp_path / "one"), sft_steps=30, rl_steps=3)
    one = copy.deepcopy(base)
    one["cluster"]["ranks_per_node"] = 2
    launch(one, str(tmp_path / "one.yaml"), timeout_s=600)
    one_dir = os.path.join(base["checkpoint_root_dir"], "quickstart", "arithmetic")

    pki = tmp_path / "pki"
    pki.mkdir()
    with netns.Hosts(3) as hosts:
        node0, node1, rollout_host = hosts
        tls = _pki(str(pki), [h.address for h in hosts])
        multi = multi_host_config(quickstart(str(tmp_path / "multi"), sft_steps=30, rl_steps=3), node0, tls)
        path = str(tmp_path / "multi.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(multi, f)
        cluster = Cluster(hosts, str(tmp_path))
        try:
            cluster.start("node0", node0, ["launch", path, f"cluster.node_address={node0.address}"])
            cluster.start(
                "node1",
                node1,
                ["launch", path, "cluster.node_rank=1", f"cluster.node_address={node1.address}"],
            )
            start_rollout_host(cluster, rollout_host, node0, multi, tls)
            rc = cluster.procs["node0"].wait(timeout=600)
            assert rc == 0, cluster.report()
            assert cluster.procs["node1"].wait(timeout=60) == 0, cluster.report()
        finally:
            cluster.close()
        out = cluster.output("node0")
        assert f"rollout workers ready: {rollout_host.address}:" in out, out
        assert "trainer node 1 of 2" in cluster.output("node1")
        assert "the trainer world finished" in cluster.output("node1")
    multi_dir = os.path.join(multi["checkpoint_root_dir"], "quickstart", "arithmetic")
    sft_one, sft_multi = _metrics(one_dir, "stage0_sft_warmup"), _metrics(multi_dir, "stage0_sft_warmup")
    assert len(sft_one) == 30
    _same_steps(sft_one, sft_multi, ("sft/loss", "actor/grad_norm"))
    rl_one, rl_multi = _metrics(one_dir, "stage1_rl"), _metrics(multi_dir, "stage1_rl")
    assert len(rl_one) == 3
    _same_steps(rl_one, rl_multi, ("rollout/reward_mean", "actor/loss", "actor/grad_norm"))
    assert any(r["rollout/reward_mean"] > 0 for r in rl_one)  # the comparison has something to compare
    shutil.rmtree(str(pki))
