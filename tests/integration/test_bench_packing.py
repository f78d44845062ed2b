"""`rlcore bench packing` end to end at its smallest size: the padded, padded-by-length and packed
trainers, each in a process of its own on the same long-tailed batch, then the JSON, table and plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_bench_packing_trains_the_same_step_on_fewer_computed_tokens(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "packing.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "packing", "--repeats", "1", "--steps", "2", "--hidden", "64",
         "--layers", "2", "--heads", "2", "--seqs", "8", "--short", "8,16", "--long", "64,128", "--long-every", "4",
         "--max-tokens", "256", "--threads", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    runs, planned = result["runs"], result["planned"]
    real = 8 * 16 + sum(result["lengths"])
    assert planned["packed"]["computed_tokens"] == real < planned["padded"]["computed_tokens"]
    assert planned["padded-by-length"]["micro_batches"] <= planned["padded"]["micro_batches"]
    # the same step however it is laid out: losses agree to float rounding, step after step
    for side in ("padded-by-length", "packed"):
        assert runs[side][0]["losses"] == pytest.approx(runs["padded"][0]["losses"], abs=1e-5)
        assert runs[side][0]["tokens"] == real and runs[side][0]["tokens_per_s"] > 0
    ratio = result["over_padded"]["packed"]["tokens_per_s"]["median"]
    assert ratio == pytest.approx(runs["packed"][0]["tokens_per_s"] / runs["padded"][0]["tokens_per_s"])
    table = out.with_suffix(".md").read_text()
    assert "| packed |" in table and "| padded |" in table and out.with_suffix(".png").is_file()
