"""The HF engine's decode loop: a transformers causal LM's forward with its KV cache, driven by rlcore.

It does what `model.generate` would for one batch, minus the work a rollout does not need:

- each prompt is prefilled once and its KV cache repeated for its n samples (generate prefills every
  sample's copy of the prompt);
- rows leave the batch as soon as they finish (generate keeps decoding finished rows as padding
  until the longest row ends);
- the sampled token's log-prob is taken from the logits already in hand (no stored logits).

Sampling applies the rules of what a row holds first (min_tokens, logit_bias, repetition, presence
and frequency penalties: hf_sampling.LogitRules), then transformers' filters in its order:
temperature, top-k, top-p, min-p. The log-prob reported for a token is log_softmax(raw / T), the
distribution the trainer recomputes, whatever the sampler's rules and filters did.

A row stops on EOS (unless `ignore_eos`), on one of `stop_token_ids`, or on a stop string; before
`min_tokens` none of them can stop it (EOS and the stop tokens are held back, ignored EOS too, and stop
strings are looked for once the response is longer than min_tokens, as in vLLM).

An `interrupt` event set while decoding (a weight update is waiting: partial rollouts) ends the call
at the next token boundary; the rows still decoding come back with the tokens so far and finish
reason "interrupted" (rollout/batching.py continues them under the new weights).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.generation.stopping_criteria import StopStringCriteria

from ...core import moe_routing
from ...core.types import SamplingParams
from .base import ending_tokens
from .hf_sampling import LogitRules, filter_logits, pick_tokens, sampled_logprobs, uniform_draws
from .hf_static import StaticDecodeStates


@dataclass
class DecodedRows:
    """What one decode call produced, row r = prompt r // n, sample r % n."""

    tokens: list[list[int]]
    """Response tokens, the stopping token (EOS, or the last of a stop string) included."""
    logprobs: list[list[float]]
    finish_reasons: list[str]
    """"stop" (EOS or a stop string), "length" or "interrupted" (see the module's docstring)."""
    routed_experts: list[bytes] | None = None
    """Each row's routing record (core/moe_routing.py's layout), when asked: `decode` given a
    recorder, `decode_static` with routing."""


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch: input ids and attention mask, [P, longest prompt]."""
    width = max(len(p) for p in prompts)
    input_ids_PL = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask_PL = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids_PL[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask_PL[row, width - len(ids) :] = 1
    return input_ids_PL, mask_PL


def prefill(
    model: Any, prompts: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache, torch.Tensor]:
    """One forward over the left-padded prompts: their input ids, mask and positions [P, W], the KV
    cache it filled, and the logits of each prompt's last token [P, V]."""
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
    return input_ids_PL, mask_PL, positions_PL, cache, out.logits[:, -1]


def seen_tokens(input_ids_PL: torch.Tensor, mask_PL: torch.Tensor, vocab: int, n: int) -> torch.Tensor:
    """[P * n, V] True where a row's prompt holds the token (padding excluded): the repetition
    penalty's history, each prompt's row repeated for its n samples."""
    counts_PV = torch.zeros((input_ids_PL.shape[0], vocab), dtype=torch.long, device=input_ids_PL.device)
    return counts_PV.scatter_add_(1, input_ids_PL, mask_PL).gt(0).repeat_interleave(n, dim=0)


def held_back(sampling: SamplingParams, eos_token_ids: list[int]) -> list[int]:
    """The tokens min_tokens holds back: EOS (even when ignored, as vLLM does) and stop_token_ids."""
    return sorted(set(eos_token_ids + sampling.stop_token_ids))


@torch.inference_mode()
def feed(
    model: Any, token_A: torch.Tensor, mask_AL: torch.Tensor, positions_A: torch.Tensor, cache: DynamicCache
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode forward: each row's sampled token fed back at its next position (the KV cache
    grows by one); the next logits [A, V], and the rows' mask and positions grown with it."""
    mask_AL = torch.cat([mask_AL, mask_AL.new_ones((mask_AL.shape[0], 1))], dim=1)
    positions_A = positions_A + 1
    logits_AV = model(
        input_ids=token_A[:, None],
        attention_mask=mask_AL,
        position_ids=positions_A[:, None],
        past_key_values=cache,
        use_cache=True,
    ).logits[:, -1]
    return logits_AV, mask_AL, positions_A


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
    interrupt: threading.Event | None = None,
    routing: moe_routing.RoutingRecorder | None = None,
) -> DecodedRows:
    """Sample n responses for each prompt (left-padded batch, KV cache, finished rows dropped);
    `row_seeds` (one per row) makes each row's draws its own; `interrupt`: see the module's docstring;
    `routing` (active around the call) records the experts every token was routed to."""
    device = next(model.parameters()).device
    input_ids_PL, mask_PL, positions_PL, cache, logits_PV = prefill(model, prompts, pad_token_id)
    routes = None if routing is None else RowRoutes(routing.take(), len(prompts), n, sampling.max_tokens)
    # every sample of a prompt starts from the same prefill
    logits_AV = logits_PV.repeat_interleave(n, dim=0)
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
    stops = ending_tokens(sampling, eos_token_ids)
    stops_t = torch.tensor(stops, dtype=torch.long, device=device)
    vocab = logits_AV.shape[-1]
    prompt_seen = seen_tokens(input_ids_PL, mask_PL, vocab, n) if sampling.repetition_penalty != 1.0 else None
    rules = LogitRules.start(sampling, prompt_seen, rows, vocab, device, held_back(sampling, eos_token_ids))
    greedy = sampling.temperature == 0
    uniform_RT = None if greedy else uniform_draws(rows, steps, row_seeds).to(device)

    for t in range(steps):
        uniform_A = None if uniform_RT is None else uniform_RT[active, t]
        token_A = pick_tokens(filter_logits(logits_AV, sampling, rules, t), greedy, uniform_A)
        tokens_RT[active, t] = token_A
        logprobs_RT[active, t] = sampled_logprobs(logits_AV, token_A, sampling.temperature)
        done_A = torch.isin(token_A, stops_t)
        if stop_matcher is not None and t >= sampling.min_tokens:  # past min_tokens, as vLLM
            done_A |= stop_matcher(tokens_RT[active, : t + 1], logits_AV)
        num_done = int(done_A.sum())  # the step's one host sync
        if num_done:
            for row in active[done_A].tolist():
                lengths[row], finish[row] = t + 1, "stop"
        if t == steps - 1 or num_done == len(done_A):
            break
        if interrupt is not None and interrupt.is_set():
            for row in active[~done_A].tolist():
                lengths[row], finish[row] = t + 1, "interrupted"
            break
        if num_done:  # finished rows leave the batch, and their KV cache with them
            keep_A = ~done_A
            active, token_A = active[keep_A], token_A[keep_A]
            mask_AL, positions_A = mask_AL[keep_A], positions_A[keep_A]
            cache.batch_select_indices(keep_A.nonzero().squeeze(-1))
            if rules is not None:
                rules.keep(keep_A)
        if rules is not None:
            rules.observe(token_A)
        logits_AV, mask_AL, positions_A = feed(model, token_A, mask_AL, positions_A, cache)
        if routes is not None and routing is not None:
            routes.step(active, t, routing.take())

    decoded = _cut(tokens_RT, logprobs_RT, lengths, finish)
    if routes is not None:
        decoded.routed_experts = routes.records(prompts, lengths)
    return decoded


class RowRoutes:
    """The routing records of one `decode` call's rows: the prefill's (every prompt token) and each
    decode step's (the token fed back), gathered per row."""

    def __init__(self, prefill_NLK: torch.Tensor, num_prompts: int, n: int, steps: int):
        self.n = n
        layers, top_k = prefill_NLK.shape[1:]
        self.prefill_PWLK = prefill_NLK.view(num_prompts, -1, layers, top_k)
        self.steps_RTLK = prefill_NLK.new_zeros((num_prompts * n, steps, layers, top_k))

    def step(self, rows: torch.Tensor | slice, t: int, record_ALK: torch.Tensor) -> None:
        """The record of the forward that fed back the tokens sampled at step `t` to `rows`."""
        self.steps_RTLK[rows, t] = record_ALK

    def records(self, prompts: list[list[int]], lengths: list[int]) -> list[bytes]:
        width = self.prefill_PWLK.shape[1]
        out = []
        for row, length in enumerate(lengths):
            prompt = self.prefill_PWLK[row // self.n, width - len(prompts[row // self.n]) :]
            out.append(moe_routing.to_bytes(torch.cat([prompt, self.steps_RTLK[row, : length - 1]])))
        return out


@torch.inference_mode()
def decode_static(
    states: StaticDecodeStates,
    prompts: list[list[int]],
    n: int,
    sampling: SamplingParams,
    *,
    eos_token_ids: list[int],
    pad_token_id: int,
    stop_matcher: StopStringCriteria | None,
    row_seeds: list[int] | None = None,
    check_every: int = 1,
    interrupt: threading.Event | None = None,
    routing: bool = False,
) -> DecodedRows:
    """`decode` over a static cache (hf_static.py): the same prefill, sampler and draws, but every
    row stays in the batch to the end (a finished row's tokens are ignored), each step is the same
    shapes (a CUDA graph replay on a GPU) and the host learns whether all rows are done only every
    `check_every` steps: the steps in between need no host sync (an `interrupt` is seen then too).
    `routing`: record the experts every token was routed to (the captured steps copy them out)."""
    model = states.model
    device = model.device
    with moe_routing.RoutingRecorder(model) if routing else nullcontext() as recorder:
        input_ids_PL, mask_PL, positions_PL, cache, logits_PV = prefill(model, prompts, pad_token_id)
    rows, width, steps = len(prompts) * n, mask_PL.shape[1], sampling.max_tokens
    routes = None if recorder is None else RowRoutes(recorder.take(), len(prompts), n, steps)
    state = states.get(rows, width + steps)
    state.start(cache, n, mask_PL, positions_PL[:, -1])
    del cache
    batch, vocab = state.batch, logits_PV.shape[-1]

    logits_BV = torch.zeros((batch, vocab), dtype=logits_PV.dtype, device=device)
    logits_BV[:rows] = logits_PV.repeat_interleave(n, dim=0)
    tokens_BT = torch.full((batch, steps), pad_token_id, dtype=torch.long, device=device)
    logprobs_BT = torch.zeros((batch, steps), dtype=torch.float32, device=device)
    length_B = torch.full((batch,), steps, dtype=torch.long, device=device)
    done_B = torch.arange(batch, device=device) >= rows  # idle rows are done from the start
    stopped_B = torch.zeros(batch, dtype=torch.bool, device=device)
    interrupted_B = torch.zeros(batch, dtype=torch.bool, device=device)
    stops = ending_tokens(sampling, eos_token_ids)
    stops_t = torch.tensor(stops, dtype=torch.long, device=device)
    rules, uniform_BT = static_sampler(
        sampling, input_ids_PL, mask_PL, n, batch, vocab, eos_token_ids, row_seeds
    )
    greedy = sampling.temperature == 0

    for t in range(steps):
        uniform_B = None if uniform_BT is None else uniform_BT[:, t]
        token_B = pick_tokens(filter_logits(logits_BV, sampling, rules, t), greedy, uniform_B)
        token_B = token_B.masked_fill(done_B, pad_token_id)
        tokens_BT[:, t] = token_B
        logprobs_BT[:, t] = sampled_logprobs(logits_BV, token_B, sampling.temperature)
        stop_B = torch.isin(token_B, stops_t)
        if stop_matcher is not None and t >= sampling.min_tokens:  # past min_tokens, as vLLM
            stop_B |= stop_matcher(tokens_BT[:, : t + 1], logits_BV)
        stop_B &= ~done_B
        length_B.masked_fill_(stop_B, t + 1)
        stopped_B |= stop_B
        done_B |= stop_B
        if t == steps - 1 or ((t + 1) % check_every == 0 and bool(done_B.all())):
            break
        if (t + 1) % check_every == 0 and interrupt is not None and interrupt.is_set():
            length_B.masked_fill_(~done_B, t + 1)
            interrupted_B = ~done_B
            break
        if rules is not None:
            rules.observe(token_B)
        logits_BV = state.step(token_B, width + t, record=routes is not None)
        if routes is not None and state.routes_BLK is not None:
            routes.step(slice(0, rows), t, state.routes_BLK[:rows])

    lengths = length_B[:rows].cpu().tolist()
    decoded = _cut(
        tokens_BT[:rows], logprobs_BT[:rows], lengths, _finish_reasons(stopped_B[:rows], interrupted_B[:rows])
    )
    if routes is not None:
        decoded.routed_experts = routes.records(prompts, lengths)
    return decoded


def static_sampler(
    sampling: SamplingParams, input_ids_PL: torch.Tensor, mask_PL: torch.Tensor, n: int, batch: int, vocab: int,
    eos_token_ids: list[int], row_seeds: list[int] | None,
) -> tuple[LogitRules | None, torch.Tensor | None]:  # fmt: skip
    """The static batch's sampling rules and uniform draws [B, max_tokens] (None when greedy): the
    first P*n rows as `decode` would have them, the idle rows after them padding."""
    device, rows, steps = input_ids_PL.device, input_ids_PL.shape[0] * n, sampling.max_tokens
    prompt_seen = None
    if sampling.repetition_penalty != 1.0:
        prompt_seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)
        prompt_seen[:rows] = seen_tokens(input_ids_PL, mask_PL, vocab, n)
    rules = LogitRules.start(sampling, prompt_seen, batch, vocab, device, held_back(sampling, eos_token_ids))
    if sampling.temperature == 0:
        return rules, None
    uniform_BT = torch.zeros((batch, steps), dtype=torch.float64, device=device)
    uniform_BT[:rows] = uniform_draws(rows, steps, row_seeds).to(device)
    return rules, uniform_BT


def _finish_reasons(stopped_R: torch.Tensor, interrupted_R: torch.Tensor) -> list[str]:
    """Each row's finish reason from the static loop's flags: stopped, interrupted, or the length."""
    stopped, interrupted = stopped_R.cpu().tolist(), interrupted_R.cpu().tolist()
    return [
        "stop" if s else "interrupted" if i else "length" for s, i in zip(stopped, interrupted, strict=True)
    ]


def _cut(
    tokens_RT: torch.Tensor, logprobs_RT: torch.Tensor, lengths: list[int], finish: list[str]
) -> DecodedRows:
    """Each row's tokens and log-probs up to its length."""
    tokens, logprobs = tokens_RT.cpu().tolist(), logprobs_RT.cpu().tolist()
    return DecodedRows(
        tokens=[row[:n] for row, n in zip(tokens, lengths, strict=True)],
        logprobs=[row[:n] for row, n in zip(logprobs, lengths, strict=True)],
        finish_reasons=finish,
    )
