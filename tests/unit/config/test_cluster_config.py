"""The cluster section's multi-host keys (and the control plane other hosts reach): refused in one
line naming the key."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError
from rlcore.runtime.nodes import torchrun_command

from .minimal import resolve

TWO_NODES = ("cluster.num_nodes=2", "cluster.rdzv_endpoint=10.0.0.1:29400", "control.host=0.0.0.0")


def test_several_nodes_need_a_rendezvous_endpoint(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"cluster\.num_nodes is 2: .* set cluster\.rdzv_endpoint to host:port"
    ):
        resolve(tmp_path, "cluster.num_nodes=2", "control.host=0.0.0.0")
    cfg = resolve(tmp_path, *TWO_NODES)
    assert cfg.cluster.ranks == 2


@pytest.mark.parametrize("endpoint", ["10.0.0.1", "node0:0", "node0:http"])
def test_a_rendezvous_endpoint_must_be_host_and_port(tmp_path, endpoint) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.rdzv_endpoint must be host:port"):
        resolve(tmp_path, f"cluster.rdzv_endpoint={endpoint}")


def test_a_node_rank_must_name_one_of_the_nodes(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"cluster\.node_rank is 2, but cluster\.num_nodes is 2: the nodes are 0\.\.1"
    ):
        resolve(tmp_path, *TWO_NODES, "cluster.node_rank=2")
    assert resolve(tmp_path, *TWO_NODES, "cluster.node_rank=1").cluster.node_rank == 1


@pytest.mark.parametrize("address", ["10.0.0.2:29400", "node 1"])
def test_a_node_address_is_a_host_without_a_port(tmp_path, address) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.node_address must be a host name or address"):
        resolve(tmp_path, *TWO_NODES, f"cluster.node_address={address}")
    assert resolve(tmp_path, *TWO_NODES, "cluster.node_address=fd00::2").cluster.node_address == "fd00::2"


def test_several_nodes_need_a_control_plane_the_other_hosts_reach(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"control\.host is 127\.0\.0\.1: .* set control\.host to 0\.0\.0\.0"
    ):
        resolve(tmp_path, *TWO_NODES[:2])


def test_joining_rollout_workers_need_a_fixed_reachable_run_port(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"start_workers false: .* set control\.run_port to a fixed port"):
        resolve(tmp_path, "explorer.rollout_model.start_workers=false", "control.host=0.0.0.0")
    with pytest.raises(ConfigError, match=r"start_workers false waits for workers to join, endpoints names"):
        resolve(
            tmp_path, "explorer.rollout_model.start_workers=false", "explorer.rollout_model.endpoints=[h:1]"
        )
    cfg = resolve(
        tmp_path,
        "explorer.rollout_model.start_workers=false",
        "control.host=0.0.0.0",
        "control.run_port=29600",
    )
    assert not cfg.explorer.rollout_model.start_workers


def test_restarts_belong_to_the_world_a_launch_starts(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.max_restarts .* with trainer\.remote"):
        resolve(tmp_path, "trainer.max_restarts=2", "trainer.remote=h:50051")


def test_torchrun_meets_the_other_nodes_with_node_0_hosting_the_rendezvous(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RLCORE_FORK_SERVER", raising=False)  # the ranks as `-m module`, not fork-server clients
    cfg = resolve(tmp_path, *TWO_NODES, "cluster.node_rank=1", "cluster.node_address=10.0.0.2")
    command = torchrun_command("plan.json", cfg.cluster, "p", "n")
    args = command[command.index("rlcore.runtime.torchrun") + 1 :]
    assert args[: args.index("-m")] == [
        "--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400",
        "--rdzv-id", "p-n", "--rdzv-conf", "is_host=0,join_timeout=600", "--local-addr", "10.0.0.2",
    ]  # fmt: skip
    node0 = resolve(tmp_path, *TWO_NODES)
    assert "is_host=1,join_timeout=600" in torchrun_command("plan.json", node0.cluster, "p", "n")
    alone = resolve(tmp_path)
    assert "--standalone" in torchrun_command("plan.json", alone.cluster, "p", "n")


@pytest.mark.parametrize("written,read", [("off", "off"), ("on", "on"), ("auto", "auto"), ("'off'", "off")])
def test_on_and_off_read_as_yaml_booleans_are_the_switches_they_name(tmp_path, written, read) -> None:
    """`cluster.fork_server=off` (as the README writes it) arrives as YAML's boolean false."""
    assert resolve(tmp_path, f"cluster.fork_server={written}").cluster.fork_server == read
    with pytest.raises(ConfigError, match=r"cluster\.fork_server must be one of auto, on, off; got 'sometimes'"):
        resolve(tmp_path, "cluster.fork_server=sometimes")
