"""Your own algorithm parts by import path, checked when the config is validated: an algorithm
(algorithm.algorithm_type 'pkg.mod:NAME', an Algorithm) with the step passes it names, an advantage
function and policy-gradient terms (algorithm.advantage_fn / policy_loss_fn 'pkg.mod:fn'), each
imported and tried on a small batch, so a wrong signature or shape fails `rlcore config validate`
in one line naming the key instead of the first training step. (Torch is imported only when a part
is given by import path.)"""

from __future__ import annotations

from typing import Any

from . import (
    ADVANTAGE_FNS,
    POLICY_LOSS_FNS,
    STEP_PASSES,
    advantage_fn_of,
    algorithm_of,
    policy_terms_of,
    with_preset,
)


def check_plugs(cfg: Any) -> None:
    """ValueError naming the key when an algorithm part given by import path cannot train (`cfg`:
    AlgorithmConfig)."""
    algo = algorithm_of(cfg)  # a bad algorithm_type path raises here
    if ":" in cfg.algorithm_type:
        from .step_pass import StepPass

        for name in algo.passes:
            STEP_PASSES.resolve_class(name, StepPass, f"algorithm.algorithm_type {cfg.algorithm_type}: pass")
    a = with_preset(cfg)
    if a.advantage_fn is not None and a.advantage_fn not in ADVANTAGE_FNS:
        _try_advantage_fn(a)
    if a.policy_loss_fn is not None and a.policy_loss_fn not in POLICY_LOSS_FNS:
        _try_policy_terms(a)


def _try_advantage_fn(a: Any) -> None:
    import torch

    from .scored import ScoredBatch

    key = f"algorithm.advantage_fn '{a.advantage_fn}'"
    fn = advantage_fn_of(a.advantage_fn)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    batch = ScoredBatch(torch.tensor([1.0, 0.0, 0.5, 1.0]), ["a", "a", "b", "b"], response_mask=mask, cfg=a)
    try:
        out = fn(batch)
    except Exception as e:
        raise ValueError(f"{key} failed on a small batch: {type(e).__name__}: {e}") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) not in ((4,), (4, 3)):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"{key} returned {shape} for 4 responses of up to 3 tokens; return a tensor of shape [N] (one per "
            "response) or [N, T] (one per response token)"
        )
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{key} returned values that are not finite on a small batch")


def _try_policy_terms(a: Any) -> None:
    import torch

    key = f"algorithm.policy_loss_fn '{a.policy_loss_fn}'"
    fn = policy_terms_of(a.policy_loss_fn)
    logprobs = torch.full((2, 3), -1.0, requires_grad=True)
    old, adv = torch.full((2, 3), -1.1), torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    try:
        out = fn(logprobs, old, adv, mask, a)
        loss, clipped = out
    except Exception as e:
        raise ValueError(f"{key} failed on a small batch: {type(e).__name__}: {e}") from None
    for what, t in (("per-token loss", loss), ("per-token clipped indicator", clipped)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (2, 3):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"{key}: its {what} is {shape} for a [2, 3] batch; return (loss, clipped), both [B, T] tensors"
            )
    if loss.grad_fn is None:
        raise ValueError(
            f"{key}: its per-token loss does not depend on the log-probs (no gradient reaches them)"
        )
