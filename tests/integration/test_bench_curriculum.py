"""`rlcore bench curriculum` end to end at its smallest size: one short SFT warm-up, then a decoupled
run (a mode-explore and a mode-train launch) without and with the difficulty filter for a few steps,
then the JSON, the table and the plot. (Filtering itself, lock-step and decoupled, with its resume:
test_task_selection_launch.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_bench_curriculum_runs_both_variants_from_one_sft_checkpoint(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "curriculum.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "curriculum", "--modes", "decoupled", "--seeds", "3",
         "--sft-steps", "30", "--steps", "4", "--eval-interval", "2", "--tasks", "32", "--heldout", "10",
         "--readmit-after", "8", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    pair = result["runs"]["decoupled"]["3"]
    plain, kept = pair["no_filter"], pair["filter"]
    assert plain["start"] == kept["start"]  # the same SFT checkpoint, evaluated before the first step
    # 2 batches of 16 an epoch: the filter had its chance from the third step, the other run never skips
    assert plain["skipped"] == 0 and [p[0] for p in kept["curve"]] == [0, 2, 4]
    assert [p[1] for p in plain["curve"]] == [0, 2 * 16 * 8, 4 * 16 * 8]  # rollouts trained on
    assert set(pair["compare"]) == {"target", "rollouts", "saving"}
    assert "| decoupled | 3 |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").stat().st_size > 0
