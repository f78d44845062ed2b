"""GPU tier of the strategy parity tests: NCCL, megatron-core unpatched (no CPU shim), float32 at
the CPU tolerances and bfloat16 within bf16 rounding, plus `rlcore launch --strategy megatron` on
the quickstart recipe. Cases needing more ranks than the machine has GPUs are skipped by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.integration.launch_utils import REPO
from tests.integration.parity_checks import run_worker
from tests.integration.parity_checks import worst_relative as _worst_relative
from tests.integration.test_strategy_parity import CASES, STEPS, reference  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]

OFFLOAD = ["fsdp_config.param_offload=true", "offload_untrained_models=true"]
GPU_CASES = [
    ("fsdp2-1-offload", "fsdp2", 1, OFFLOAD),
    ("fsdp-1-offload", "fsdp", 1, OFFLOAD),
    ("megatron-1-optimizer-offload", "megatron", 1, ["megatron.optimizer_offload_fraction=1.0"]),
]
"""Cases for a GPU only: offloading to the CPU is a copy there, CPU shards of a device mesh take the
device path (the gradient norm on the device; the CPU tier runs fsdp2's on two ranks), and FSDP1's
CPUOffload and megatron-core's HybridDeviceOptimizer (16-bit parameters only) refuse a CPU."""
BF16_ONLY = {"megatron-1-optimizer-offload"}

# dtype -> (first-step loss, gradient relative, loss curve) tolerances
TOLERANCES = {"float32": (1e-5, 1e-4, 1e-3), "bfloat16": (3e-2, 8e-2, 1e-1)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dtype", list(TOLERANCES))
@pytest.mark.parametrize("case", CASES + GPU_CASES, ids=[c[0] for c in CASES + GPU_CASES])
def test_strategy_matches_reference_on_cuda(case, dtype, reference, tiny_model_path, tmp_path):  # noqa: F811
    case_id, strategy, ranks, sets = case
    if case_id in BF16_ONLY and dtype != "bfloat16":
        pytest.skip(f"{case_id}: megatron-core offloads the optimizer of 16-bit parameters only")
    if ranks > torch.cuda.device_count():
        pytest.skip(f"{case_id} needs {ranks} GPUs; this machine has {torch.cuda.device_count()}")
    run = run_worker(
        tiny_model_path, strategy, ranks, sets, str(tmp_path),
        "--steps", str(STEPS), "--total-steps", str(STEPS), "--device", "cuda", "--dtype", dtype,
    )  # fmt: skip
    follows(run, reference, dtype)
    loss_tol = TOLERANCES[dtype][0]
    for key in ("reference_logprob_diffs", "trained_reference_logprob_diffs"):  # an offloaded reference
        assert max(run.result.get(key, [0.0])) <= loss_tol, (key, run.result[key])


def follows(run, ref, dtype: str) -> None:
    """`run` is within the dtype's TOLERANCES of the reference run `ref`: its first loss, every
    gradient, its loss at every step."""
    loss_tol, grad_tol, curve_tol = TOLERANCES[dtype]
    ref_losses, ref_grads, _ = ref
    assert abs(run.result["losses"][0] - ref_losses[0]) <= loss_tol, (run.result["losses"][0], ref_losses[0])
    worst, rel = _worst_relative(run.grads, ref_grads)
    assert rel <= grad_tol, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    diffs = [abs(a - b) for a, b in zip(run.result["losses"], ref_losses, strict=True)]
    assert max(diffs) <= curve_tol, diffs


@pytest.mark.timeout(1800)
def test_quickstart_trains_with_megatron_on_cuda(tmp_path):
    env = {**os.environ, "RLCORE_CHECKPOINT_DIR": str(tmp_path)}
    cmd = [
        sys.executable, "-m", "rlcore.cli", "launch", "--strategy", "megatron", "configs/quickstart.yaml",
    ]  # fmt: skip
    cmd += ["cluster.device=cuda", "model.dtype=bfloat16"]
    if torch.cuda.device_count() < 2:  # the rollout worker shares the GPU; NCCL sync cannot
        cmd.append("synchronizer.sync_method=checkpoint")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    runs = os.path.join(str(tmp_path), "quickstart", "arithmetic")
    metrics = []
    for root, _, files in sorted(os.walk(runs)):  # stage0_sft_warmup before stage1_grpo
        if "metrics.jsonl" in files:
            with open(os.path.join(root, "metrics.jsonl")) as f:
                metrics += [json.loads(line) for line in f]
    accuracy = [m["eval/test/accuracy"] for m in metrics if "eval/test/accuracy" in m]
    assert len(accuracy) >= 2 and accuracy[-1] > accuracy[0], accuracy
