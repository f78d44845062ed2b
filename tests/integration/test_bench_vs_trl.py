"""`rlcore bench trl` end to end at the smallest size: one rlcore run and one TRL GRPOTrainer run
on the same model and prompts, each a real process, then the JSON, the markdown table and the plot."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_bench_trl_measures_both_frameworks_on_the_same_work(tmp_path) -> None:
    pytest.importorskip("trl", reason="TRL is the benchmark's peer: pip install 'rlcore[bench]'")
    out = tmp_path / "vs_trl.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "trl", "--comparisons", "same_engine", "--repeats", "1",
         "--steps", "2", "--prompts", "2", "--group", "2", "--max-tokens", "4", "--trl-configs", "matched", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    comparison = result["comparisons"]["same_engine"]
    assert comparison["headline"] == "matched" and list(comparison["trl_configs"]) == ["matched"]
    (pair,) = comparison["pairs"]
    for side in ("rlcore", "trl"):
        run = pair[side]
        assert len(run["step_s"]) == 2  # the measured steps, after the warm-up step
        assert all(s > 0 for s in run["step_s"])
        # 2 prompts x 2 completions of at most 4 tokens, plus the prompts
        assert all(8 <= t <= 4 * (16 + 4) for t in run["tokens"]), run["tokens"]
        assert all(t > 0 for t in run["phases"]["generate"])
        assert all(t > 0 for t in run["phases"]["forward_backward"])
        assert all(4 <= g <= 2 * 2 * 4 for g in run["generated_tokens"]), run["generated_tokens"]
        for i, step in enumerate(run["step_s"]):  # the phases account for the step, no more
            assert sum(run["phases"][p][i] for p in run["phases"]) == pytest.approx(step, rel=0.05)
    ratio = comparison["ratios_rlcore_over_trl"]["step_s"]
    assert ratio["median"] == pytest.approx(
        comparison["sides"]["rlcore"]["step_s"]["median"] / comparison["sides"]["trl"]["step_s"]["median"]
    )
    rollout = comparison["sides"]["rlcore"]["rollout_tokens_per_s"]["median"]
    assert rollout == pytest.approx(
        statistics.median(pair["rlcore"]["generated_tokens"]) / statistics.median(pair["rlcore"]["phases"]["generate"])
    )
    table = (tmp_path / "vs_trl.md").read_text()
    assert "| same_engine | hf | matched |" in table and "| same_engine | matched |" in table
    assert "forward_backward" in table and "forward_backward" in table
    assert "on CPU (" in table and "- (no GPU peak)" in table  # the header names the device; no MFU on CPU
    assert (tmp_path / "vs_trl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
