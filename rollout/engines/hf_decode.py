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
from typing import Any

import torch
from transformers.generation.stopping_criteria import StopStringCriteria

from ...core import moe_routing
from ...core.types import SamplingParams
from .base import ending_tokens
from .hf_grammar import RowGrammars
from .hf_running import DecodedRows, RowRoutes, RunningBatch, held_back, prefill, seen_tokens
from .hf_sampling import LogitRules, filter_logits, pick_tokens, sampled_logprobs, uniform_draws
from .hf_static import StaticDecodeStates


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
    interrupt: threading.Event | None = None,
    routing: moe_routing.RoutingRecorder | None = None,
    grammar: RowGrammars | None = None,
) -> DecodedRows:
    """Sample n responses for each prompt (left-padded batch, KV cache, finished rows dropped):
    one request alone in a running batch (hf_running.py); `row_seeds` (one per row) makes each row's
    draws its own; `interrupt`: see the module's docstring; `routing` records the experts every
    token was routed to (the batch enters it around its forwards); `grammar`: the rows' structured
    output."""
    batch = RunningBatch(
        model, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, interrupt=interrupt, routing=routing
    )
    group = batch.add(prompts, n, sampling, matcher=stop_matcher, row_seeds=row_seeds, grammar=grammar)
    while not group.done:
        batch.step()
    if group.error is not None:
        raise group.error
    return group.decoded()


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
    if state is states.held:  # the engine lock keeps generate out while its running batch decodes
        raise RuntimeError("decode_static: the static cache's state is held by the engine's running batch")
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
