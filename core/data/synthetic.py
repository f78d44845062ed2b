"""Synthetic tasksets generated locally (the quickstart needs no download)."""

from __future__ import annotations

import itertools
import json
import os
import random


def write_arithmetic_taskset(
    path: str,
    part: str = "train",
    num_tasks: int = 1000,
    max_operand: int = 99,
    ops: str = "+",
    test_fraction: float = 0.2,
    seed: int = 0,
) -> None:
    """Write `num_tasks` rows like {"prompt": "37+48=", "response": "<answer>85</answer>", "answer": "85"}.

    Every problem `a op b` with 0 <= a, b <= max_operand is enumerated, shuffled with `seed` and split
    into a train and a test part by `test_fraction`; files made with the same seed and fraction
    never share a problem, so `part: test` is a true held-out set.
    """
    if part not in ("train", "test"):
        raise ValueError(f"part must be train or test; got '{part}'")
    unknown = set(ops) - set("+-*")
    if unknown or not ops:
        raise ValueError(f"ops must be made of + - *; got '{ops}'")
    problems = list(itertools.product(range(max_operand + 1), range(max_operand + 1), ops))
    random.Random(seed).shuffle(problems)
    n_test = int(len(problems) * test_fraction)
    pool = problems[:n_test] if part == "test" else problems[n_test:]
    if num_tasks > len(pool):
        raise ValueError(f"num_tasks ({num_tasks}) exceeds the {len(pool)} {part} problems available")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for a, b, op in pool[:num_tasks]:
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            row = {"prompt": f"{a}{op}{b}=", "response": f"<answer>{value}</answer>", "answer": str(value)}
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
