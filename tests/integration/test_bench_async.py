"""`rlcore bench async` end to end at its smallest size: a rollout worker started by hand on one CPU,
launches on another, lock-step and asynchronous at staleness 1, then the JSON, table and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_bench_async_measures_lockstep_and_asynchronous_sides(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"needs 2 usable CPUs to give each side its own; this process has {cpus}")
    out = tmp_path / "async.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "async", "--repeats", "1", "--steps", "2", "--prompts", "2",
         "--group", "2", "--max-tokens", "4", "--staleness", "1", "--trainer-cpus", str(cpus[0]),
         "--rollout-cpus", str(cpus[1]), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    lock, ahead = result["runs"]["lockstep"][0], result["runs"]["async-1"][0]
    assert set(lock["staleness"]) == {0.0} and max(ahead["staleness"]) <= 1.0
    assert lock["tokens_per_s"] > 0 and ahead["tokens_per_s"] > 0
    ratio = result["ratio_over_lockstep"]["async-1"]["median"]
    assert ratio == pytest.approx(ahead["tokens_per_s"] / lock["tokens_per_s"])
    assert len(result["reward_curve"]["lockstep"]) == len(lock["reward"])
    assert result["ideal_ratio"]["median"] >= 1 and lock["generate_s"] > 0 and lock["train_s"] > 0
    table = out.with_suffix(".md").read_text()
    assert "| lockstep |" in table and "| async-1 |" in table and f"**{ratio:.2f}**" in table
    assert out.with_suffix(".png").stat().st_size > 0
