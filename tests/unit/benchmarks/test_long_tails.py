"""`rlcore bench tails` pieces that need no launch: the slow tail's choice of tasks, the workflow's
argument checks, and the table from the committed results."""

from __future__ import annotations

import json
import os

import pytest

from rlcore.benchmarks.long_tails import SIDES, SlowTailWorkflow, is_slow, markdown, side_config

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks", "results", "tails.json")


def test_the_slow_tail_is_a_fixed_share_of_the_task_ids() -> None:
    ids = [f"train-{i}" for i in range(4000)]
    share = sum(is_slow(t, 0.125) for t in ids) / len(ids)
    assert 0.11 < share < 0.14
    assert [is_slow(t, 0.125) for t in ids[:50]] == [is_slow(t, 0.125) for t in ids[:50]]
    assert not any(is_slow(t, 0.0) for t in ids) and all(is_slow(t, 1.0) for t in ids)


@pytest.mark.parametrize(
    "args, message",
    [({"slow_fraction": 2}, r"workflow_args\.slow_fraction must be a number in \[0, 1\]"),
     ({"slow_s": -1}, r"workflow_args\.slow_s must be a number of seconds >= 0"),
     ({"slow": 1}, r"workflow_args: unknown key\(s\) slow; this workflow takes slow_fraction, slow_s")],
)  # fmt: skip
def test_the_slow_tail_workflow_refuses_bad_args(args: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlowTailWorkflow.check_args(args)


def test_each_side_sets_its_explorer_keys() -> None:
    assert side_config("wait-all", 0.25) == {}
    assert side_config("over-rollout", 0.25)["over_rollout"]["ratio"] == 0.25
    assert side_config("dynamic-timeout", 0.25)["max_retry_times"] == 0


def test_the_committed_results_render_as_the_table() -> None:
    with open(RESULTS) as f:
        result = json.load(f)
    table = markdown(result)
    for side in SIDES:
        assert f"| {side} |" in table
    ratio = result["ratio_over_wait_all"]["over-rollout"]["median"]
    assert f"**{ratio:.2f}**" in table
