"""Checks of where a run's processes live: host:port addresses, the trainer nodes (rendezvous, node
rank and address, restarts) and a control plane the other hosts reach."""

from __future__ import annotations

from ..rpc.address import LOOPBACK_HOSTS, is_host_port
from .errors import ConfigError
from .schema import ClusterConfig, RLCoreConfig

CLUSTER_KEYS = {key: f"cluster.{key}" for key in ("num_nodes", "node_rank", "rdzv_endpoint", "node_address")}
"""How a launch's config spells the trainer nodes' settings (`check_nodes` names them in errors)."""


def check_hosts(cfg: RLCoreConfig) -> None:
    """Hosts: the trainer nodes' rendezvous and place, and a control plane the other hosts reach."""
    cluster, control = cfg.cluster, cfg.control
    check_nodes(cluster, CLUSTER_KEYS)
    if cluster.num_nodes > 1 and control.host in LOOPBACK_HOSTS:
        raise ConfigError(
            f"cluster.num_nodes is {cluster.num_nodes}, but control.host is {control.host}: trainer rank 0 may run "
            "on any node and reaches the controller and rollout workers over the network; set control.host to "
            "0.0.0.0 or this host's address"
        )
    rm = cfg.explorer.rollout_model
    if not rm.start_workers:
        if rm.endpoints:
            raise ConfigError(
                "explorer.rollout_model.start_workers false waits for workers to join, endpoints names running "
                "ones: set one of them"
            )
        if not control.run_port or control.host in LOOPBACK_HOSTS:
            raise ConfigError(
                "explorer.rollout_model.start_workers false: rollout workers on other hosts join with `rlcore "
                "rollout serve --register <host>:<port>`; set control.run_port to a fixed port and control.host to "
                f"an interface they reach (0.0.0.0 or this host's address; now {control.host}:{control.run_port})"
            )


def check_nodes(cluster: ClusterConfig, keys: dict[str, str]) -> None:
    """A trainer world's nodes: a rendezvous across hosts, a node rank among them, an address
    without a port; `keys` spells each setting as the user gave it (config keys, or the flags of
    `rlcore trainer serve`)."""
    if cluster.rdzv_endpoint:
        check_address(cluster.rdzv_endpoint, keys["rdzv_endpoint"])
    elif cluster.num_nodes > 1:
        raise ConfigError(
            f"{keys['num_nodes']} is {cluster.num_nodes}: a trainer world across hosts meets at a rendezvous; "
            f"set {keys['rdzv_endpoint']} to host:port on the first node, reachable from every node"
        )
    if cluster.node_rank >= cluster.num_nodes:
        raise ConfigError(
            f"{keys['node_rank']} is {cluster.node_rank}, but {keys['num_nodes']} is {cluster.num_nodes}: "
            f"the nodes are 0..{cluster.num_nodes - 1} (node 0 hosts the rendezvous)"
        )
    address = cluster.node_address
    if any(c.isspace() for c in address) or address.count(":") == 1:  # one colon: host:port (IPv6 has more)
        raise ConfigError(f"{keys['node_address']} must be a host name or address (no port); got '{address}'")


def check_address(value: str, path: str) -> None:
    """`host:port` with a port in 1..65535 (IPv6 hosts in brackets: [::1]:50051)."""
    if not is_host_port(value):
        raise ConfigError(f"{path} must be host:port with a port in 1..65535; got '{value}'")


TINKER_SCHEMES = {"tinker://": "http://", "tinker+https://": "https://"}
"""How trainer.remote names a Tinker service, and the scheme of its base URL."""


def tinker_url(remote: str | None) -> str | None:
    """The base URL of the Tinker service trainer.remote names (tinker://host:port ->
    http://host:port; tinker+https://host/path -> https://host/path); None: it names none."""
    for scheme, web in TINKER_SCHEMES.items():
        if remote is not None and remote.startswith(scheme):
            rest = remote[len(scheme) :]
            host = rest.split("/", 1)[0]
            if not host or any(c.isspace() for c in rest):
                raise ConfigError(f"trainer.remote must be {scheme}host[:port][/path]; got '{remote}'")
            return web + rest
    return None
