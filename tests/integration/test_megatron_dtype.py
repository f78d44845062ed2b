"""megatron in bfloat16: every weight in the compute dtype, as the weight sync announces it.

megatron-core builds its torch norms on the CPU in float32 whatever config.params_dtype says; the
strategy moves and casts the whole module. Without that the policy's and the reference's norms stay
float32, and a sync announcing bfloat16 meets float32 tensors and stops."""

from __future__ import annotations

import json
import subprocess

import pytest

from .launch_utils import REPO, python_m

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_megatron_in_bf16_holds_and_yields_every_weight_in_bf16(tiny_model_path: str) -> None:
    proc = subprocess.run(
        python_m("tests.integration.megatron_dtype_worker", tiny_model_path),
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["policy"] == ["torch.bfloat16"]
    assert got["reference"] == ["torch.bfloat16"]
    assert got["weights"] == got["specs"]
