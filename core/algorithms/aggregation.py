"""Per-token values -> one scalar, normalised by counts of the WHOLE train batch.

A train batch is split into micro-batches and across ranks; each piece's `aggregate` is divided by
the global counts in `LossNorm`, so summing the pieces (gradient accumulation, all-reduce) gives
exactly the value the whole batch would give, however it was split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass
class LossNorm:
    """Global counts of the train batch (all micro-batches, all ranks)."""

    num_tokens: float
    """Sum of the loss mask."""
    num_seqs: float
    """Sequences with at least one loss token."""
    max_response_len: int
    """Constant divisor of seq-mean-token-sum-norm (the response budget, as in Dr. GRPO)."""

    def __post_init__(self) -> None:
        assert self.num_tokens > 0 and self.num_seqs > 0, f"empty train batch: {self}"

    @classmethod
    def local(cls, mask: torch.Tensor, max_response_len: int) -> LossNorm:
        """Counts of one mask, for a batch that is not split."""
        return cls(
            num_tokens=float(mask.sum()),
            num_seqs=float((mask.sum(-1) > 0).sum()),
            max_response_len=max_response_len,
        )


def check_loss_agg_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}; got '{mode}'")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm) -> torch.Tensor:
    """This micro-batch's share of the batch-level aggregate of `values` [B, T] over `mask` [B, T].

    token-mean: every token weighs the same (long responses weigh more);
    seq-mean-token-sum: mean over sequences of the token sum;
    seq-mean-token-mean: mean over sequences of the token mean (every sequence weighs the same);
    seq-mean-token-sum-norm: token sum / max_response_len, mean over sequences (Dr. GRPO: unbiased
    in length, unlike token-mean's and seq-mean-token-mean's length-dependent weighting).
    """
    check_loss_agg_mode(mode)
    masked = values * mask
    if mode == "token-mean":
        return masked.sum() / norm.num_tokens
    if mode == "seq-mean-token-sum":
        return masked.sum() / norm.num_seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / norm.num_seqs
    return masked.sum() / norm.max_response_len / norm.num_seqs


def token_weights(mask: torch.Tensor, mode: str, norm: LossNorm) -> torch.Tensor:
    """[B, T] each token's weight in `aggregate`: sum(values * token_weights) == aggregate(values,
    mask, mode, norm) for any values. A service that sums its loss over tokens (Tinker's losses)
    computes rlcore's aggregate when the per-token inputs it multiplies (advantages, weights) carry
    these weights."""
    check_loss_agg_mode(mode)
    mask = mask.float()
    if mode == "token-mean":
        return mask / norm.num_tokens
    if mode == "seq-mean-token-sum":
        return mask / norm.num_seqs
    if mode == "seq-mean-token-mean":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1) / norm.num_seqs
    return mask / norm.max_response_len / norm.num_seqs
