"""The HF engine's decode loop: a transformers causal LM's forward with its KV cache, driven by rlcore.

It does what `model.generate` would for one batch, minus the work a rollout does not need:

- each prompt is prefilled once and its KV cache repeated for its n samples (generate prefills every
  sample's copy of the prompt);
- rows leave the batch as soon as they finish (generate keeps decoding finished rows as padding
  until the longest row ends);
- the sampled token's log-prob is taken from the logits already in hand (no stored logits).

Sampling follows transformers' processor order: repetition penalty on the raw logits, then
temperature, top-k, top-p, min-p. The log-prob reported for a token is log_softmax(raw / T), the
distribution the trainer recomputes, whatever the sampler's filters did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.generation.stopping_criteria import StopStringCriteria

from ...core.algorithms.logprob import token_logprobs
from ...core.types import SamplingParams


@dataclass
class DecodedRows:
    """What one decode call produced, row r = prompt r // n, sample r % n."""

    tokens: list[list[int]]
    """Response tokens, the stopping token (EOS, or the last of a stop string) included."""
    logprobs: list[list[float]]
    finish_reasons: list[str]
    """"stop" (EOS or a stop string) or "length"."""


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


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch: input ids and attention mask, [P, longest prompt]."""
    width = max(len(p) for p in prompts)
    input_ids_PL = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask_PL = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids_PL[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask_PL[row, width - len(ids) :] = 1
    return input_ids_PL, mask_PL


@torch.inference_mode()
def decode(
    model: Any,
    prompts: list[list[int]],
    n: int,
    sampling: SamplingParams,
    *,
    eos_token_ids: list[int],
    pad_token_id: int,
    stop_matcher: StopStringCriteria | None,
    row_seeds: list[int] | None = None,
) -> DecodedRows:
    """Sample n responses for each prompt (left-padded batch, KV cache, finished rows dropped);
    `row_seeds` (one per row) makes each row's draws its own."""
    device = next(model.parameters()).device
    input_ids_PL, mask_PL = (x.to(device) for x in left_pad(prompts, pad_token_id))
    positions_PL = (mask_PL.cumsum(-1) - 1).clamp(min=0)

    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=input_ids_PL,
        attention_mask=mask_PL,
        position_ids=positions_PL,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    # every sample of a prompt starts from the same prefill
    logits_AV = out.logits[:, -1].repeat_interleave(n, dim=0)
    if n > 1:
        cache.batch_repeat_interleave(n)
    mask_AL = mask_PL.repeat_interleave(n, dim=0)
    positions_A = positions_PL[:, -1].repeat_interleave(n, dim=0)

    rows = len(prompts) * n
    steps = sampling.max_tokens
    tokens_RT = torch.full((rows, steps), pad_token_id, dtype=torch.long, device=device)
    logprobs_RT = torch.zeros((rows, steps), dtype=torch.float32, device=device)
    lengths = [steps] * rows
    finish = ["length"] * rows
    active = torch.arange(rows, device=device)  # row of each batch entry still decoding
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    seen_AV = None
    if sampling.repetition_penalty != 1.0:  # the tokens each row has so far, padding excluded
        counts_PV = torch.zeros((len(prompts), logits_AV.shape[-1]), dtype=torch.long, device=device)
        seen_AV = counts_PV.scatter_add_(1, input_ids_PL, mask_PL).gt(0).repeat_interleave(n, dim=0)
    greedy = sampling.temperature == 0
    uniform_RT = None if greedy else uniform_draws(rows, steps, row_seeds).to(device)

    for t in range(steps):
        uniform_A = None if uniform_RT is None else uniform_RT[active, t]
        token_A = pick_tokens(filter_logits(logits_AV, sampling, seen_AV), greedy, uniform_A)
        tokens_RT[active, t] = token_A
        logprobs_RT[active, t] = sampled_logprobs(logits_AV, token_A, sampling.temperature)
        done_A = torch.isin(token_A, eos)
        if stop_matcher is not None:
            done_A |= stop_matcher(tokens_RT[active, : t + 1], logits_AV)
        num_done = int(done_A.sum())  # the step's one host sync
        if num_done:
            for row in active[done_A].tolist():
                lengths[row], finish[row] = t + 1, "stop"
        if t == steps - 1 or num_done == len(done_A):
            break
        if num_done:  # finished rows leave the batch, and their KV cache with them
            keep_A = ~done_A
            active, token_A = active[keep_A], token_A[keep_A]
            mask_AL, positions_A = mask_AL[keep_A], positions_A[keep_A]
            cache.batch_select_indices(keep_A.nonzero().squeeze(-1))
            if seen_AV is not None:
                seen_AV = seen_AV[keep_A]
        if seen_AV is not None:
            seen_AV.scatter_(1, token_A[:, None], True)
        mask_AL = torch.cat([mask_AL, mask_AL.new_ones((mask_AL.shape[0], 1))], dim=1)
        positions_A = positions_A + 1
        logits_AV = model(
            input_ids=token_A[:, None],
            attention_mask=mask_AL,
            position_ids=positions_A[:, None],
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]

    tokens = tokens_RT.cpu().tolist()
    logprobs = logprobs_RT.cpu().tolist()
    return DecodedRows(
        tokens=[tokens[r][: lengths[r]] for r in range(rows)],
        logprobs=[logprobs[r][: lengths[r]] for r in range(rows)],
        finish_reasons=finish,
    )
