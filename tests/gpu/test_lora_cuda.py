"""GPU tier of the LoRA parity tests: megatron's adapters (backends/megatron/lora.py) and fsdp2's peft
model on CUDA, megatron-core unpatched, against the plain peft model of test_lora_parity.py: float32
at the CPU tolerances, bfloat16 within bf16 rounding (test_strategy_parity_cuda.py's)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_strategy_parity_cuda import TOLERANCES, follows
from tests.integration.parity_checks import run_worker
from tests.integration.test_lora_parity import STEPS, adapter, reference  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("strategy", ["megatron", "fsdp2"])
def test_lora_matches_peft_on_cuda(strategy, dtype, reference, adapter, tiny_model_path, tmp_path):  # noqa: F811
    run = run_worker(
        tiny_model_path, strategy, 1, [], str(tmp_path), "--lora", adapter,
        "--steps", str(STEPS), "--total-steps", str(STEPS), "--device", "cuda", "--dtype", dtype,
    )  # fmt: skip
    follows(run, reference, dtype)
    assert max(run.result["reference_logprob_diffs"]) <= TOLERANCES[dtype][0]  # the adapter switched off
