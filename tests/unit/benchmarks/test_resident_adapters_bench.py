"""`rlcore bench resident-adapters`: both sides decode the same batch and the table reports their ratio."""

from __future__ import annotations

import pytest

pytest.importorskip("peft", reason="the benchmark saves its adapter with peft: pip install 'rlcore[lora]'")

from rlcore.benchmarks.resident_adapters import markdown, measure_model  # noqa: E402


def test_the_adapter_and_merged_sides_are_timed_alternately_and_compared() -> None:
    row = measure_model("quickstart", 4, prompts=2, tokens=4, repeats=2)
    assert len(row["seconds"]["merged"]) == len(row["seconds"]["adapter"]) == 2
    assert all(t > 0 for side in row["seconds"].values() for t in side)
    assert 0 < row["ratio"]["min"] <= row["ratio"]["median"] <= row["ratio"]["max"]
    assert "| quickstart | 0.9M | 4 | 2 x 4 |" in markdown({"models": [row]})
