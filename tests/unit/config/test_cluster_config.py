"""The cluster section's multi-host keys: refused in one line naming the key."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve


def test_several_nodes_need_a_rendezvous_endpoint(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"cluster\.num_nodes is 2: .* set cluster\.rdzv_endpoint to host:port"
    ):
        resolve(tmp_path, "cluster.num_nodes=2")
    cfg = resolve(tmp_path, "cluster.num_nodes=2", "cluster.rdzv_endpoint=10.0.0.1:29400")
    assert cfg.cluster.ranks == 2


@pytest.mark.parametrize("endpoint", ["10.0.0.1", "node0:0", "node0:http"])
def test_a_rendezvous_endpoint_must_be_host_and_port(tmp_path, endpoint) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.rdzv_endpoint must be host:port"):
        resolve(tmp_path, f"cluster.rdzv_endpoint={endpoint}")
