"""HF -> megatron-core conversion of every family the mapping covers (Llama, Qwen2, Qwen3, Qwen3-MoE),
at TP1, TP2, PP2 and (Qwen3-MoE) EP2 and TP2+EP2: the whole model's logits equal the HF model's within 1e-5
(float32). The round trip
back to HF names is bit-exact (tests/unit/backends/test_megatron_mapping.py) and first-step
gradients match HF's in the parity suite (test_strategy_parity.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .launch_utils import REPO, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


DENSE = ["llama_gqa", "qwen2_gqa", "qwen3_gqa"]
LAYOUTS = [
    # (tp, pp, ep, families): Qwen3-MoE's experts split over 2 EP ranks; a MoE model at TP > 1 runs with
    # sequence parallelism
    (1, 1, 1, [*DENSE, "qwen3_moe"]),
    (2, 1, 1, [*DENSE, "qwen3_moe"]),  # Qwen3-MoE: every expert whole on each TP rank, sequence parallelism
    (1, 2, 1, [*DENSE, "qwen3_moe"]),
    (1, 1, 2, ["qwen3_moe"]),
    (2, 1, 2, ["qwen3_moe"]),  # TP2+EP2: sequence parallelism (the experts' EP group is the TP group)
]


@pytest.mark.parametrize("tp,pp,ep,cases", LAYOUTS, ids=[f"tp{t}-pp{p}-ep{e}" for t, p, e, _ in LAYOUTS])
def test_megatron_logits_equal_hf_for_every_family(tp: int, pp: int, ep: int, cases: list[str], tmp_path) -> None:
    pytest.importorskip("megatron.core")
    out = tmp_path / "errors.json"
    cmd = torchrun(max(tp * pp, ep), "tests.integration.megatron_logits_worker", "--tp", str(tp), "--pp", str(pp),
                   "--ep", str(ep), "--cases", ",".join(cases), "--out", str(out))  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(out.read_text())
    assert sorted(errors) == sorted(f"{c}{t}" for c in cases for t in ("", "-tied"))
    assert max(errors.values()) < 1e-5, errors
