"""`rlcore bench growth` end to end at its smallest size: two points per curve and a short memory
run, each a real `rlcore launch`, then the JSON, the markdown tables and the plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlcore.benchmarks.common import PHASES
from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_bench_growth_measures_both_curves_and_memory(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "cost_growth.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "growth", "--batch-sizes", "1,2", "--lengths", "2,4",
         "--prompts", "2", "--group", "2", "--max-tokens", "4", "--steps", "1", "--repeats", "1",
         "--memory-steps", "6", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    batch, length = result["curves"]["batch"], result["curves"]["length"]
    assert [r["prompts"] for r in batch] == [1, 2] and {r["max_tokens"] for r in batch} == {4}
    assert [r["max_tokens"] for r in length] == [2, 4] and {r["prompts"] for r in length} == {2}
    for row in batch + length:
        step = row["step_s"]["median"]
        assert step > 0 and row["tokens_per_s"]["median"] > 0
        assert 1 <= row["response_len"]["median"] <= row["max_tokens"]
        # prompt + response tokens of prompts x group sequences
        sequences = row["prompts"] * 2
        assert sequences * 2 <= row["tokens_per_step"]["median"] <= sequences * (16 + row["max_tokens"])
        assert sum(row[f"phase_{p}_s"]["median"] for p in PHASES) == pytest.approx(step, rel=0.05)
    assert batch[0]["growth"]["median"] == length[0]["growth"]["median"] == 1.0
    # more prompts is more work: tokens per step grow along the batch curve
    assert [r["tokens_ratio"]["median"] for r in batch] == sorted(r["tokens_ratio"]["median"] for r in batch)

    memory = result["memory"]
    assert memory["steps"] == list(range(1, 7))
    assert all(r > 0 for r in memory["rss_gib"]) and memory["max_rss_gib"] == max(memory["rss_gib"])
    assert memory["peak_rss_gib"] >= memory["max_rss_gib"]
    assert list(memory["rss_at_step_gib"]) == ["6"]  # steps 10 and 50 are past this run's end
    assert memory["verdict"] in ("flat", "growing")

    table = (tmp_path / "cost_growth.md").read_text()
    assert "**batch**" in table and "**length**" in table and "**memory**" in table
    assert (tmp_path / "cost_growth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
