"""`rlcore bench curriculum`'s own arithmetic (benchmarks/curriculum.py): the taskset it builds (every
other problem without a carry, a held-out set of carry problems only), the target, and the rollouts
each run needed to reach it."""

from __future__ import annotations

import json

from rlcore.benchmarks.curriculum import (
    GAIN_SHARE,
    carries,
    compare,
    rollouts_to,
    solved_or_answer,
    write_tasks,
)
from rlcore.core.types import Task


def test_a_carry_is_a_ones_column_sum_of_ten_or_more() -> None:
    assert carries("27+15=") and carries("5+5=") and not carries("23+14=") and not carries("40+9=")


def test_the_taskset_alternates_solved_and_carry_problems_and_holds_out_carries(tmp_path) -> None:
    train, heldout = write_tasks(str(tmp_path), 10, 6)
    rows = [json.loads(line) for line in open(train)]
    assert [carries(r["prompt"]) for r in rows] == [False, True] * 5
    held = [json.loads(line) for line in open(heldout)]
    assert len(held) == 6 and all(carries(r["prompt"]) for r in held)
    assert not {r["prompt"] for r in held} & {r["prompt"] for r in rows}  # the generator's test part


def test_the_saving_is_the_ratio_of_rollouts_to_the_unfiltered_runs_target() -> None:
    plain = {"start": 0.2, "final": 0.6, "curve": [[0, 0, 0.2], [4, 512, 0.4], [8, 1024, 0.55], [12, 1536, 0.6]]}
    kept = {"start": 0.2, "final": 0.7, "curve": [[0, 0, 0.2], [4, 512, 0.58], [8, 1024, 0.7]]}
    c = compare({"no_filter": plain, "filter": kept})
    assert abs(c["target"] - (0.2 + GAIN_SHARE * 0.4)) < 1e-12  # 0.56
    assert c["rollouts"] == {"no_filter": 1536, "filter": 512} and c["saving"] == 3.0
    assert rollouts_to(kept["curve"], 0.9) is None
    assert compare({"no_filter": plain, "filter": {**kept, "curve": [[0, 0, 0.2]]}})["saving"] is None


def test_the_solved_half_is_marked_and_paid_whatever_the_response(tmp_path) -> None:
    """--easy solved: the no-carry rows carry `solved`, and its reward pays them 1.1 for anything
    (a group of equal rewards, as a task the policy always solves), the carry rows the quickstart's."""
    train, _ = write_tasks(str(tmp_path), 10, 6, "solved")
    rows = [json.loads(line) for line in open(train)]
    assert [r.get("solved", False) for r in rows] == [True, False] * 5
    solved = Task(task_id="t-0", prompt=rows[0]["prompt"], answer=rows[0]["answer"], metadata={"solved": True})
    carry = Task(task_id="t-1", prompt=rows[1]["prompt"], answer=rows[1]["answer"])
    assert solved_or_answer("nonsense", solved) == solved_or_answer(f"<answer>{rows[0]['answer']}</answer>", solved) == 1.1
    assert solved_or_answer(f"<answer>{rows[1]['answer']}</answer>", carry) == 1.1
    assert solved_or_answer("<answer>0</answer>", carry) == 0.1 and solved_or_answer("0", carry) == 0.0
