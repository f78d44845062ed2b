"""Rollout routing replay in real launches: `rlcore bench routing` at its smallest size runs
configs/qwen3_moe_r3.yaml (shortened) with r3 and with none. With r3 the bfloat16 HF engine's
records cross the worker's gRPC stream to the float32 fsdp2 trainer, whose old-log-prob pass and
update replay them on packed rows: the trainer reports the share of replayed routes its own router
would have chosen otherwise at every step (no record lost on the way), and at step 1, where both
launches explore the same rollouts, the engine/trainer log-prob gap is no larger with replay."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_the_engines_routing_is_replayed_by_the_trainer(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "routing.json"
    sets = ["stages.0.buffer.total_steps=20", "stages.1.buffer.total_steps=3", "stages.1.explorer.eval_on_startup=false",
            "stages.1.explorer.eval_interval=0", "cluster.threads_per_rank=1"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "routing", "--repeats", "1", "--out", str(out),
         *[f"--set={s}" for s in sets]],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (r3,), (none,) = result["runs"]["r3"], result["runs"]["none"]
    assert r3["steps"] == none["steps"] == r3["mismatch_steps"] == 3  # the share at every step
    assert r3["mismatch_mean"] is not None and 0.0 <= r3["mismatch_mean"] < 0.05, r3  # bf16 against fp32
    assert none["mismatch_mean"] is None  # nothing recorded, nothing replayed
    assert r3["gap_step1"] <= none["gap_step1"], (r3, none)
    assert "| log-prob gap per token, step 1 (same rollouts) |" in out.with_suffix(".md").read_text()

