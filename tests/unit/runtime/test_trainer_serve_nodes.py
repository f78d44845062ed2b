"""`rlcore trainer serve` across hosts: its node flags refused in one line naming the flag, and the
ranks it gives each node's processes (node 0's first rank serves)."""

from __future__ import annotations

import pytest

from rlcore.cli.main import main
from rlcore.runtime.trainer_serve import world_rank


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--nnodes", "2"], "--nnodes is 2: a trainer world across hosts meets at a rendezvous; set --rdzv-endpoint"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:29400"], "--node-rank is 2, but --nnodes is 2"),
        (["--nnodes", "2", "--rdzv-endpoint", "h"], "--rdzv-endpoint must be host:port"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--node-address", "a:1"], "--node-address must be a host name"),
        (["--nnodes", "0"], "--nnodes must be >= 1; got 0"),
        (["--node-rank", "-1"], "--node-rank must be >= 0; got -1"),
        (["--collective-timeout", "0"], "--collective-timeout must be >= 1; got 0.0"),
    ],
)  # fmt: skip
def test_node_flags_are_refused_in_one_line_naming_the_flag(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCORE_TOKEN", "t")
    assert main(["trainer", "serve", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlcore: error: ") and said in err and "\n" not in err, err


def test_node_0s_first_rank_is_rank_0_whatever_order_the_rendezvous_gave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "0")  # torchrun ranked this node first (its address sorts first)
    ranks = {}
    for node in range(3):
        for local in range(2):
            monkeypatch.setenv("LOCAL_RANK", str(local))
            ranks[node, local] = world_rank({"num_nodes": 3, "node_rank": node, "ranks": 2})
    assert ranks[0, 0] == 0 and sorted(ranks.values()) == list(range(6))
    assert [ranks[1, 0], ranks[1, 1]] == [2, 3]  # a node's ranks stay neighbours
    monkeypatch.setenv("RANK", "5")
    assert world_rank({"num_nodes": 1, "node_rank": 0, "ranks": 8}) == 5  # one host: torchrun's
