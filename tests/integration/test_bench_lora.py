"""`rlcore bench lora` end to end at its smallest size: a full fine-tuning, a LoRA and an offloading
trainer, each in a process of its own with KL on and bfloat16 compute, then the JSON, table and plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_bench_lora_measures_each_side_with_the_reference_pass(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "lora.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "lora", "--repeats", "1", "--steps", "2", "--hidden", "64",
         "--layers", "2", "--heads", "2", "--rank", "4", "--seqs", "2", "--response-tokens", "8", "--threads", "1",
         "--sides", "full,lora,offload", "--dtype", "bfloat16", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # bfloat16: LoRA's reference (peft's disable_adapter) ran FSDP2's first forward, which then left
    # the adapter's bfloat16 gradients uncast for its float32 parameters (the LoRA side crashed)
    full, lora, offload = (result["runs"][side][0] for side in ("full", "lora", "offload"))
    # LoRA trains the adapter only, r x (in + out) on q, k, v, o (64 -> 64) and the MLP's three
    # (64 <-> 256) of each of 2 blocks, against every weight
    assert lora["trained_params"] == 2 * 4 * (4 * (64 + 64) + 3 * (64 + 256))
    assert full["trained_params"] == offload["trained_params"] == result["params"] > 10 * lora["trained_params"]
    for side in (full, lora, offload):
        assert (
            side["trainer_peak_gib"] > 0
            and side["step_s"] > 0
            and side["peak_rss_gib"] >= side["trainer_peak_gib"]
        )
    ratio = result["lora_over_full"]["trainer_peak_gib"]["median"]
    assert ratio == pytest.approx(lora["trainer_peak_gib"] / full["trainer_peak_gib"])
    table = out.with_suffix(".md").read_text()
    assert result["offload_over_full"]["step_s"]["median"] > 0
    assert "| full |" in table and "| lora |" in table and "| offload |" in table and out.with_suffix(".png").is_file()
