"""What the parity tests share: a parity_worker run under torchrun, and the checks of a run against
the plain HF reference (parity_reference.py) or against the run it resumes."""

from __future__ import annotations

import json
import os
import subprocess
from typing import NamedTuple

import torch

from .launch_utils import REPO, torchrun


class Run(NamedTuple):
    out: str
    """The worker's --out folder (the checkpoint is `out/ckpt`)."""
    result: dict
    """result.json: losses, grad_norms, lrs per step."""
    grads: dict[str, torch.Tensor]
    weights: dict[str, torch.Tensor]


def run_worker(
    model: str, strategy: str, ranks: int, sets: list[str], out: str, *extra: str, timeout_s: float = 600
) -> Run:
    """Launch parity_worker under torchrun; return what rank 0 wrote."""
    cmd = torchrun(
        ranks, "tests.integration.parity_worker", "--model", model, "--strategy", strategy, "--out", out,
        *[f"--set={s}" for s in sets], *extra,
    )  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    grads = torch.load(os.path.join(out, "grads.pt"), weights_only=True)
    weights = torch.load(os.path.join(out, "weights.pt"), weights_only=True)
    return Run(out, result, grads, weights)


def worst_relative(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[str, float]:
    """(name, max |got - want| / max |want|) of the tensor that differs most."""
    errors = {n: float((got[n] - want[n]).abs().max() / want[n].abs().max().clamp(min=1e-30)) for n in want}
    name = max(errors, key=lambda n: errors[n])
    return name, errors[name]


def assert_first_step(run: Run, reference: tuple[list[float], dict[str, torch.Tensor], dict]) -> None:
    """The first step's loss within 1e-5 of the reference's, the untrained policy's log-probs within
    1e-5 of the HF model's, every gradient (by HF name, HF shape) within 1e-4 of its largest magnitude."""
    result, grads = run.result, run.grads
    ref_losses, ref_grads, _ = reference
    assert abs(result["losses"][0] - ref_losses[0]) <= 1e-5, (result["losses"][0], ref_losses[0])
    # compute_logprobs of the untrained policy equals the HF model's (which gave old_logprobs)
    assert result["logprob_diffs"] and max(result["logprob_diffs"]) <= 1e-5, result["logprob_diffs"]
    for key in ("reference_logprob_diffs", "trained_reference_logprob_diffs"):  # an offloaded reference
        assert max(result.get(key, [0.0])) <= 1e-5, (key, result[key])
    # each strategy has its own (fixed) order; the names are the HF model's
    assert sorted(grads) == sorted(ref_grads), "gradient names differ from the HF state dict's"
    for name, g in grads.items():
        assert g.shape == ref_grads[name].shape, (name, tuple(g.shape), tuple(ref_grads[name].shape))
    worst, rel = worst_relative(grads, ref_grads)
    assert rel <= 1e-4, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"


def assert_curve(result: dict, ref_losses: list[float], steps: int) -> None:
    """Every step's loss within 1e-3 of the reference's, on a curve that really moves."""
    # the batch is hard enough that the curve really moves (a flat curve would prove little)
    assert ref_losses[-1] < ref_losses[0] - 1.0, ref_losses
    assert len(result["losses"]) == steps
    diffs = [abs(a - b) for a, b in zip(result["losses"], ref_losses, strict=True)]
    step = max(range(steps), key=lambda i: diffs[i])
    assert diffs[step] <= 1e-3, f"step {step + 1}: loss {result['losses'][step]} vs {ref_losses[step]}"


def assert_resumed(resumed: Run, straight: Run, save_at: int) -> None:
    """A run resumed from `straight`'s step-`save_at` checkpoint took its later steps: the same
    learning rates, losses within 1e-6, the same final weights within 1e-6."""
    assert resumed.result["lrs"] == straight.result["lrs"][save_at:]
    tail = straight.result["losses"][save_at:]
    for step, (a, b) in enumerate(zip(resumed.result["losses"], tail, strict=True)):
        assert abs(a - b) <= 1e-6, f"step {save_at + step + 1}: resumed loss {a} vs {b}"
    assert list(resumed.weights) == list(straight.weights)
    for name, w in resumed.weights.items():
        assert (w - straight.weights[name]).abs().max().item() <= 1e-6, name
