"""HF -> megatron-core conversion of every family the mapping covers (Llama, Qwen2, Qwen3), at TP1,
TP2 and PP2: the whole model's logits equal the HF model's within 1e-5 (float32). The round trip
back to HF names is bit-exact (tests/unit/backends/test_megatron_mapping.py) and first-step
gradients match HF's in the parity suite (test_strategy_parity.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .launch_utils import REPO, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_megatron_logits_equal_hf_for_every_family(tp: int, pp: int, tmp_path) -> None:
    pytest.importorskip("megatron.core")
    out = tmp_path / "errors.json"
    cmd = torchrun(tp * pp, "tests.integration.megatron_logits_worker", "--tp", str(tp), "--pp", str(pp),
                   "--out", str(out))  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(out.read_text())
    assert sorted(errors) == sorted(f"{c}{t}" for c in ("llama_gqa", "qwen2_gqa", "qwen3_gqa") for t in ("", "-tied"))
    assert max(errors.values()) < 1e-5, errors
