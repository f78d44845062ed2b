"""`rlcore bench adapter-sync`: its counts on the quickstart's shape are what a launch logs, and the
adapter alone is a fraction of the merged weights."""

from __future__ import annotations

import pytest

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'rlcore[lora]'")

from rlcore.benchmarks.adapter_sync import markdown, measure_model  # noqa: E402


def test_the_adapter_alone_is_a_fraction_of_the_merged_weights_and_the_first_sync_carries_the_base() -> None:
    row = measure_model("quickstart", 16)
    sizes = row["bytes"]
    assert sizes["adapter"] < sizes["merged"] < sizes["adapter_first"]
    assert sizes["adapter_first"] == pytest.approx(sizes["merged"] + sizes["adapter"], rel=0.01)
    assert round(sizes["adapter"] / 1e6, 2) == 0.62 and round(sizes["merged"] / 1e6, 2) == 3.25  # as logged
    assert "| quickstart |" in markdown({"models": [row]})
