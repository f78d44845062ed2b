"""The HF engine's sampler, per decode step: the filters transformers' generate applies (repetition
penalty, temperature, top-k, top-p, min-p, in its order), inverse-CDF draws from per-row uniforms, and
the sampled token's log-prob under temperature only (the distribution the trainer recomputes).

Every function works on whole [rows, vocab] tensors without a host sync, so the static decode loop
(hf_decode.decode_static) runs them on the device step after step.
"""

from __future__ import annotations

import torch

from ...core.algorithms.logprob import token_logprobs
from ...core.types import SamplingParams


def filter_logits(
    logits_RV: torch.Tensor, sampling: SamplingParams, seen_RV: torch.Tensor | None
) -> torch.Tensor:
    """The logits the sampler draws from: repetition penalty, temperature, top-k, top-p, min-p (in
    transformers' order); filtered tokens get -inf. `seen_RV` marks the tokens each row already has
    (prompt and response), needed only with a repetition penalty."""
    scores = logits_RV.float()
    if sampling.repetition_penalty != 1.0 and seen_RV is not None:
        penalised = torch.where(
            scores < 0, scores * sampling.repetition_penalty, scores / sampling.repetition_penalty
        )
        scores = torch.where(seen_RV, penalised, scores)
    if sampling.temperature == 0:
        return scores  # greedy: only the penalty changes which token is the largest
    scores = scores / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass
        drop_sorted = (probs.cumsum(dim=-1) - probs) > sampling.top_p
        drop_sorted[:, 0] = False
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    if sampling.min_p > 0:
        probs = scores.softmax(dim=-1)
        floor = sampling.min_p * probs.max(dim=-1, keepdim=True).values
        scores = scores.masked_fill(probs < floor, float("-inf"))
    return scores


def pick_tokens(scores_RV: torch.Tensor, greedy: bool, uniform_R: torch.Tensor | None) -> torch.Tensor:
    """The largest score (greedy), or the token whose slice of the cumulative distribution holds
    each row's uniform draw (inverse-CDF sampling: filtered tokens hold an empty slice)."""
    if greedy or uniform_R is None:
        return scores_RV.argmax(dim=-1)
    cdf_RV = scores_RV.softmax(dim=-1).double().cumsum(dim=-1)
    picked = torch.searchsorted(cdf_RV, (uniform_R * cdf_RV[:, -1])[:, None].contiguous(), right=True)
    return picked.squeeze(-1).clamp(max=scores_RV.shape[-1] - 1)


def uniform_draws(rows: int, steps: int, row_seeds: list[int] | None) -> torch.Tensor:
    """[rows, steps] uniforms for the sampler: from each row's own generator when seeded (a row's
    tokens then depend on its prompt and seed only, not on the rows beside it), else from torch's
    global RNG."""
    if row_seeds is None:
        return torch.rand(rows, steps, dtype=torch.float64)
    return torch.stack(
        [
            torch.rand(steps, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
            for s in row_seeds
        ]
    )


def sampled_logprobs(logits_RV: torch.Tensor, tokens_R: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at each row's token (T = 0: the raw logits), computed by the function
    the trainer scores responses with."""
    if temperature > 0:
        logits_RV = logits_RV.float() / temperature
    return token_logprobs(logits_RV[:, None], tokens_R[:, None])[:, 0]
