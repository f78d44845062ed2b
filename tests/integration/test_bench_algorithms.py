"""`rlcore bench algorithms` end to end at its smallest size: one short SFT warm-up, then grpo
(rollouts) and dpo (offline pairs) from its checkpoint for two steps each, then the JSON, the table
and the plot. (mix's expert rows beside the rollouts: test_algorithm_menu.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _bench(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "algorithms", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip


def test_bench_algorithms_runs_each_algorithm_from_one_sft_checkpoint(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "algorithms.json"
    proc = _bench("--algorithms", "grpo,dpo", "--seeds", "3", "--sft-steps", "30", "--steps", "2",
                  "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = {name: per["3"] for name, per in result["runs"].items()}
    assert list(runs) == ["grpo", "dpo"]
    # one SFT checkpoint: every RL stage's first evaluation scores the same weights
    assert len({r["start"] for r in runs.values()}) == 1 and result["sft_checkpoint_accuracy"] == runs["grpo"]["start"]
    for r in runs.values():
        assert r["steps"] == 2 and [point[0] for point in r["curve"]] == [0, 2]  # before the first step, after the last
        assert 0 <= r["curve"][0][1] < r["curve"][-1][1] and r["trained_tokens"] > 0
    # the quickstart's budget: 16 tasks x 8 responses a step; dpo explores nothing and trains on 16
    # pairs a step
    assert runs["grpo"]["explored"] == 2 * 16 * 8
    assert runs["dpo"]["explored"] == 0 and runs["dpo"]["offline_rows"] == 2 * 16
    table = out.with_suffix(".md").read_text()
    for name in runs:
        assert f"| {name} | {100 * runs[name]['final']:.1f}% |" in table
    assert "offline: 32" in table and out.with_suffix(".png").stat().st_size > 0


def test_bench_algorithms_names_the_algorithms_it_knows(tmp_path) -> None:
    proc = _bench("--algorithms", "grpo,ppo2", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 2
    assert "--algorithms must list some of grpo, dapo, dpo, dr_grpo" in proc.stderr and "got 'grpo,ppo2'" in proc.stderr
