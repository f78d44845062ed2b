"""`rlcore bench rollout-ahead` end to end at its smallest size: a trainer served by hand on one CPU,
launches on another, one on-policy run and one with the rollout ahead, then the JSON, table and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _bench(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "rollout-ahead", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip


def test_bench_rollout_ahead_runs_both_sides_on_separate_cpus(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"needs 2 usable CPUs to give each side its own; this process has {cpus}")
    out = tmp_path / "rollout_ahead.json"
    proc = _bench("--repeats", "1", "--steps", "1", "--prompts", "2", "--group", "2", "--max-tokens", "4",
                  "--trainer-cpus", str(cpus[0]), "--rollout-cpus", str(cpus[1]), "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    on, ahead = result["runs"]["on_policy"], result["runs"]["ahead"]
    assert len(on) == len(ahead) == 1
    assert on[0]["staleness_mean"] == 0.0 and ahead[0]["staleness_mean"] == 1.0  # ahead really ran ahead
    assert on[0]["generate_s"] > 0 and on[0]["train_s"] > 0 and ahead[0]["train_s"] > 0
    ratio = result["ratio_ahead_over_on_policy"]["median"]
    assert ratio == pytest.approx(ahead[0]["step_s"] / on[0]["step_s"])
    assert 0 < result["ideal_ratio"]["median"] <= 1
    table = out.with_suffix(".md").read_text()
    assert "| on_policy |" in table and "| ahead |" in table and f"**{ratio:.2f}**" in table
    assert out.with_suffix(".png").stat().st_size > 0


def test_bench_rollout_ahead_refuses_sides_sharing_a_cpu(tmp_path) -> None:
    proc = _bench("--trainer-cpus", "0", "--rollout-cpus", "0", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 2
    assert "--trainer-cpus and --rollout-cpus must not share a CPU" in proc.stderr
