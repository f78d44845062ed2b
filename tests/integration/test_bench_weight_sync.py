"""`rlcore bench weight-sync` end to end at its smallest size, with the HF receiving engine: the two
processes on one gloo group, every variant measured, the receiver's weights checked against the
sender's, then the JSON and the markdown tables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO
from tests.integration.vllm_support import require_vllm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

VARIANTS = {"raw", "raw_packed", "rlcore", "checksums", "in_process", "reload"}


# the vLLM receiver is run by `rlcore bench weight-sync --engine vllm` by hand (68 s here: CI time); its
# weight loading path is the one test_vllm_loop.py syncs every step
@pytest.mark.parametrize("engine", ["hf"])
def test_bench_weight_sync_measures_every_variant_and_lands_the_weights(tmp_path, engine: str) -> None:
    if engine == "vllm":
        require_vllm()
    out = tmp_path / "weight_sync.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "weight-sync", "--engine", engine, "--sizes", "10m",
         "--repeats", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"]["engine"] == engine
    size = result["sizes"]["10m"]
    # the receiver started zeroed: its weights equal the sender's only if every tensor arrived
    assert size["weights_match"] == {"rlcore": True, "in_process": True}
    assert set(size["gb_per_s"]) == VARIANTS
    assert {r["kind"] for r in size["runs"]} == VARIANTS and len(size["runs"]) == len(VARIANTS)
    for run in size["runs"]:
        assert run["total_s"] > 0
    rlcore = next(r for r in size["runs"] if r["kind"] == "rlcore")
    assert rlcore["sender"]["num_bytes"] == size["wire_bytes"] == rlcore["receiver"]["num_bytes"]
    assert rlcore["receiver"]["load_s"] > 0
    if engine == "vllm":  # the collective_rpc round trip, apart from the worker's own receive and load
        assert rlcore["receiver"]["rpc_s"] >= 0
    assert set(size["ratios"]) == {f"{k}_over_raw" for k in VARIANTS - {"raw"}} | {
        "rlcore_over_raw_packed",
        "rlcore_over_serial",
    }
    table = (tmp_path / "weight_sync.md").read_text()
    assert "| 10m |" in table and "rlcore / (raw then reload)" in table
    assert "10m: yes" in table  # the weights line
