"""`rlcore bench partial` end to end at its smallest size: a rollout worker started by hand on one
CPU (with --partial-rollout on the partial side), launches on another, then the JSON, table and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_bench_partial_measures_waiting_and_interrupting_loads(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"needs 2 usable CPUs to give each side its own; this process has {cpus}")
    out = tmp_path / "partial.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "partial", "--repeats", "1", "--steps", "2", "--prompts", "4",
         "--group", "2", "--max-tokens", "48", "--short-tokens", "4", "--long-fraction", "0.5",
         "--trainer-cpus", str(cpus[0]), "--rollout-cpus", str(cpus[1]), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    wait, partial = result["runs"]["wait"][0], result["runs"]["partial"][0]
    for side in (wait, partial):
        assert side["tokens_per_s"] > 0 and side["explore_step_s"] > 0 and side["idle_per_step_s"] >= 0
        assert 0 < side["engine_busy_frac"] <= 1 and side["tasks_left_running"] > 0  # over-rollout left some
    assert wait["interrupted_per_step"] == 0.0  # a load waits: nothing is interrupted
    ratio = result["ratio_over_wait"]["median"]
    assert ratio == pytest.approx(partial["tokens_per_s"] / wait["tokens_per_s"])
    table = out.with_suffix(".md").read_text()
    assert "| wait |" in table and "| partial |" in table and f"**{ratio:.2f}**" in table
    assert out.with_suffix(".png").stat().st_size > 0
