"""GPU tier of the LoRA parity tests: megatron's adapters (backends/megatron/lora.py) and fsdp2's peft
model on CUDA, megatron-core unpatched, against the plain peft model of test_lora_parity.py: float32
at the CPU tolerances, bfloat16 within bf16 rounding."""

from __future__ import annotations

import pytest
import torch

from tests.integration.parity_checks import run_worker
from tests.integration.parity_checks import worst_relative as _worst_relative
from tests.integration.test_lora_parity import STEPS, adapter, reference  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]

# dtype -> (first-step loss, gradient relative, loss curve) tolerances, as test_strategy_parity_cuda.py's
TOLERANCES = {"float32": (1e-5, 1e-4, 1e-3), "bfloat16": (3e-2, 8e-2, 1e-1)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("strategy", ["megatron", "fsdp2"])
def test_lora_matches_peft_on_cuda(strategy, dtype, reference, adapter, tiny_model_path, tmp_path):  # noqa: F811
    run = run_worker(
        tiny_model_path, strategy, 1, [], str(tmp_path), "--lora", adapter,
        "--steps", str(STEPS), "--total-steps", str(STEPS), "--device", "cuda", "--dtype", dtype,
    )  # fmt: skip
    loss_tol, grad_tol, curve_tol = TOLERANCES[dtype]
    ref_losses, ref_grads, _ = reference
    assert abs(run.result["losses"][0] - ref_losses[0]) <= loss_tol, (run.result["losses"][0], ref_losses[0])
    worst, rel = _worst_relative(run.grads, ref_grads)
    assert rel <= grad_tol, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    assert max(abs(a - b) for a, b in zip(run.result["losses"], ref_losses, strict=True)) <= curve_tol
    assert max(run.result["reference_logprob_diffs"]) <= loss_tol  # the adapter switched off
