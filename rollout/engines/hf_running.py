"""The HF engine's running batch: the rows of many requests decoded together, each request joining
at a token boundary and leaving when its last row ends (continuous batching).

A request (`Group`: prompts, n samples of each, one SamplingParams) keeps everything its sampling
needs to itself: temperature, top-k/top-p/min-p, penalties and logit bias (hf_sampling.LogitRules),
its seeded draws, its stop tokens and stop strings, its max_tokens and its own step count. The
rows of every request share one forward per step over one KV cache (`BatchRows`): a request
joining is prefilled by itself, then its rows join the cache. In transformers' dynamic cache
(hf_dynamic_batch.DynamicRows, eager) its cache is laid beside the running one and rows that
finish are cut out; in a static cache (hf_static_batch.StaticRows, CUDA graphs on a GPU) it takes
free slots and the rows that finish free theirs. A request's tokens therefore depend on its
prompt, sampling and seed only, not on the requests decoded beside it.

A step: every request samples from its rows' logits (hf_decode.decode's rules and order), the host
learns which rows ended (the step's one sync), finished rows leave, the others' tokens are fed
back. With `sync_every` k (the static cache on a GPU), the host looks at the ends once per k steps
only: a row that ended in between is noted on the device and decodes on until then, the tokens
past its end cut. An `interrupt` set meanwhile (a weight update is waiting: partial rollouts) ends every request
at the next token boundary with finish reason "interrupted" for the rows still decoding.
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache
from transformers.generation.stopping_criteria import StopStringCriteria

from ...core import moe_routing
from ...core.algorithms.logprob import token_logprobs
from ...core.types import SamplingParams
from .base import StructuredOutputRefused, TokensOut, ending_tokens
from .hf_dynamic_batch import DynamicRows
from .hf_grammar import RowGrammars
from .hf_sampling import LogitRules, filter_logits, pick_tokens, sampled_logprobs, uniform_draws

log = logging.getLogger(__name__)


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


def score_prompt(model: Any, prompt: list[int], topk: int = 0) -> tuple[list[float], tuple[torch.Tensor, torch.Tensor] | None]:
    """log p(prompt[i] | prompt[:i]) for i >= 1, by the function the trainer scores with, from one
    forward of the prompt alone, and the `topk` likeliest tokens after each prompt[:i] with their
    log-probs ([len - 1, k] each; None when topk is 0)."""
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    logits = model(input_ids=ids).logits[:, :-1].float()
    scored = token_logprobs(logits, ids[:, 1:])[0].tolist()
    if not topk:
        return scored, None
    values, tokens = torch.log_softmax(logits[0], dim=-1).topk(topk, dim=-1)
    return scored, (tokens, values)


def held_back(sampling: SamplingParams, eos_token_ids: list[int]) -> list[int]:
    """The tokens min_tokens holds back: EOS (even when ignored, as vLLM does) and stop_token_ids."""
    return sorted(set(eos_token_ids + sampling.stop_token_ids))


@dataclass
class DecodedRows:
    """What one request's decoding produced, row r = prompt r // n, sample r % n."""

    tokens: list[list[int]]
    """Response tokens, the stopping token (EOS, or the last of a stop string) included."""
    logprobs: list[list[float]]
    finish_reasons: list[str]
    """"stop" (EOS or a stop string), "length" or "interrupted" (see the module's docstring)."""
    routed_experts: list[bytes] | None = None
    """Each row's routing record (core/moe_routing.py's layout), when asked."""
    prompt_logprobs: list[list[float]] | None = None
    """Each prompt's token log-probs (log p(prompt[i] | prompt[:i]), i >= 1), when asked."""
    top_logprobs: list[list[list[tuple[int, float]]]] | None = None
    """Each row's k likeliest (token, log-prob) at every response position, when asked."""


@dataclass(eq=False)
class Group:
    """One request's rows in the running batch and its sampling state; `active` are its rows still
    decoding (in batch order: a request's rows are contiguous in the batch)."""

    prompts: list[list[int]]
    n: int
    sampling: SamplingParams
    matcher: StopStringCriteria | None
    stops_t: torch.Tensor
    rules: LogitRules | None
    uniform_RT: torch.Tensor | None
    tokens_RT: torch.Tensor
    logprobs_RT: torch.Tensor
    active: torch.Tensor
    routes: RowRoutes | None = None
    on_tokens: TokensOut | None = None
    prompt_scores: list[list[float]] | None = None
    """Each prompt's token log-probs (SamplingParams.prompt_logprobs), from its prefill step."""
    top_RTK: tuple[torch.Tensor, torch.Tensor] | None = None
    """The k likeliest tokens and their log-probs at each row's steps (SamplingParams.top_logprobs)."""
    grammar: RowGrammars | None = None
    """Each row's grammar (SamplingParams.structured_output): what it may draw next."""
    lengths: list[int] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    t: int = 0
    """Tokens sampled so far by each active row (the decode step the request is at)."""
    ended_A: torch.Tensor | None = None
    """Active rows that ended at a step the host has not looked at yet (RunningBatch's sync_every),
    and each such row's length in `ended_len_A`: they decode on, their tokens past it cut."""
    ended_len_A: torch.Tensor | None = None
    done: bool = False
    error: StructuredOutputRefused | None = None
    """Why the request ended without its completions (its grammar found no token to go on with)."""

    def sample(self, logits_AV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The active rows' next tokens from their logits, and which of them end the row."""
        s, t = self.sampling, self.t
        uniform_A = None if self.uniform_RT is None else self.uniform_RT[self.active, t]
        allowed_AV = logits_AV if self.grammar is None else self.grammar.masked(logits_AV, self.active)
        token_A = pick_tokens(filter_logits(allowed_AV, s, self.rules, t), s.temperature == 0, uniform_A)
        if self.grammar is not None:
            self.grammar.accept(self.active, token_A)
        self.tokens_RT[self.active, t] = token_A
        self.logprobs_RT[self.active, t] = sampled_logprobs(logits_AV, token_A, s.temperature)
        if self.top_RTK is not None:
            scores_AV = logits_AV.float() / s.temperature if s.temperature > 0 else logits_AV.float()
            values_AK, ids_AK = torch.log_softmax(scores_AV, dim=-1).topk(s.top_logprobs, dim=-1)
            self.top_RTK[0][self.active, t], self.top_RTK[1][self.active, t] = ids_AK, values_AK
        done_A = torch.isin(token_A, self.stops_t)
        if self.matcher is not None and t >= s.min_tokens:  # past min_tokens, as vLLM
            done_A |= self.matcher(self.tokens_RT[self.active, : t + 1], logits_AV)
        return token_A, done_A

    def defer(self, done_A: torch.Tensor) -> None:
        """The rows `done_A` ended at this step, which the host does not look at: they are noted
        on the device (length t + 1, unless they ended before) and decode on."""
        if self.ended_A is None or self.ended_len_A is None:
            self.ended_A = torch.zeros_like(done_A)
            self.ended_len_A = torch.zeros_like(self.active)
        self.ended_len_A = torch.where(done_A & ~self.ended_A, self.t + 1, self.ended_len_A)
        self.ended_A = self.ended_A | done_A

    def ended(self, done_A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """At a step the host looks at: the active rows ended by now and each one's length (this
        step's t + 1, or the step it ended at before); the noted ends are cleared."""
        length_A = torch.full_like(self.active, self.t + 1)
        if self.ended_A is None or self.ended_len_A is None:
            return done_A, length_A
        ended_A, length_A = done_A | self.ended_A, torch.where(self.ended_A, self.ended_len_A, length_A)
        self.ended_A = self.ended_len_A = None
        return ended_A, length_A

    def decoded(self) -> DecodedRows:
        """Each row's tokens and log-probs up to its length."""
        tokens, logprobs = self.tokens_RT.cpu().tolist(), self.logprobs_RT.cpu().tolist()
        rows = DecodedRows(
            tokens=[row[:n] for row, n in zip(tokens, self.lengths, strict=True)],
            logprobs=[row[:n] for row, n in zip(logprobs, self.lengths, strict=True)],
            finish_reasons=self.finish,
        )
        if self.routes is not None:
            rows.routed_experts = self.routes.records(self.prompts, self.lengths)
        rows.prompt_logprobs = self.prompt_scores
        if self.top_RTK is not None:
            ids, values = (x.cpu().tolist() for x in self.top_RTK)
            rows.top_logprobs = [
                [list(zip(ids[r][t], values[r][t], strict=True)) for t in range(length)]
                for r, length in enumerate(self.lengths)
            ]
        return rows


class RunningBatch:
    """The rows being decoded on `model`, of the requests `add`ed; `step` decodes one token for
    each. `kv` keeps the rows' KV cache and feeds them (default: DynamicRows). `routing` records
    the experts of every forward (the batch enters it around its own forwards); each request's rows
    then carry their routing records."""

    def __init__(
        self, model: Any, *, eos_token_ids: list[int], pad_token_id: int,
        interrupt: threading.Event | None = None, routing: moe_routing.RoutingRecorder | None = None,
        kv: BatchRows | None = None, sync_every: int = 1,
    ) -> None:  # fmt: skip
        """`sync_every`: the host learns which rows ended once per this many steps (a GPU's
        steps between run ahead of it); every step while a request streams its tokens or holds to
        a grammar, at a request's last token and when interrupted."""
        self.model = model
        self.sync_every = sync_every
        self._steps = 0
        self.device = next(model.parameters()).device
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.interrupt = interrupt
        self.routing = routing
        self.kv: BatchRows = kv if kv is not None else DynamicRows(model, routing)
        self.groups: list[Group] = []
        self._joining: list[Group] = []

    @property
    def rows(self) -> int:
        """Rows decoding now, or from the next step."""
        return sum(len(g.active) for g in self.groups + self._joining)

    def add(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, *,
        matcher: StopStringCriteria | None = None, row_seeds: list[int] | None = None,
        on_tokens: TokensOut | None = None, grammar: RowGrammars | None = None,
    ) -> Group:  # fmt: skip
        """Decode n samples of each of `prompts` from the next step on (the requests added since
        the last step are prefilled together at its start); `row_seeds` (one per row) makes each
        row's draws its own; `grammar` (one matcher per row) holds them to a structured output."""
        rows, steps, device = len(prompts) * n, sampling.max_tokens, self.device
        group = Group(
            prompts=prompts, n=n, sampling=sampling, matcher=matcher,
            stops_t=torch.tensor(ending_tokens(sampling, self.eos_token_ids), dtype=torch.long, device=device),
            rules=None,
            uniform_RT=None if sampling.temperature == 0 else uniform_draws(rows, steps, row_seeds).to(device),
            tokens_RT=torch.full((rows, steps), self.pad_token_id, dtype=torch.long, device=device),
            logprobs_RT=torch.zeros((rows, steps), dtype=torch.float32, device=device),
            active=torch.arange(rows, device=device), on_tokens=on_tokens, grammar=grammar,
            lengths=[steps] * rows, finish=["length"] * rows,
        )  # fmt: skip
        if sampling.top_logprobs:
            k = sampling.top_logprobs
            group.top_RTK = (
                torch.zeros((rows, steps, k), dtype=torch.long, device=device),
                torch.zeros((rows, steps, k), dtype=torch.float32, device=device),
            )
        self._joining.append(group)
        return group

    def _prefill_joining(self) -> None:
        """One prefill of every prompt of the requests added since the last step; their rows (each
        prompt's KV cache repeated for its n samples) join the running batch."""
        joining, self._joining = self._joining, []
        prompts = [p for g in joining for p in g.prompts]
        with self.routing if self.routing is not None else nullcontext():
            input_ids_PL, mask_PL, positions_PL, cache, logits_PV = prefill(self.model, prompts, self.pad_token_id)
        vocab = logits_PV.shape[-1]
        record_PWLK = None
        if self.routing is not None:
            record = self.routing.take()
            record_PWLK = record.view(len(prompts), -1, *record.shape[1:])
        rows_of, budgets, first = [], [], 0  # each row's prompt and max_tokens, in the batch's order
        for g in joining:
            mine = slice(first, first + len(g.prompts))
            first += len(g.prompts)
            rows_of += [p for p in range(mine.start, mine.stop) for _ in range(g.n)]
            budgets += [g.sampling.max_tokens] * (len(g.prompts) * g.n)
            seen = None
            if g.sampling.repetition_penalty != 1.0:
                seen = seen_tokens(input_ids_PL[mine], mask_PL[mine], vocab, g.n)
            rows = len(g.prompts) * g.n
            g.rules = LogitRules.start(
                g.sampling, seen, rows, vocab, self.device, held_back(g.sampling, self.eos_token_ids)
            )
            if g.sampling.prompt_logprobs:
                g.prompt_scores = [score_prompt(self.model, p)[0] for p in g.prompts]
            if record_PWLK is not None:
                mine_NLK = record_PWLK[mine].reshape(-1, *record_PWLK.shape[2:])
                g.routes = RowRoutes(mine_NLK, len(g.prompts), g.n, g.sampling.max_tokens)
        index = torch.tensor(rows_of, device=self.device)
        if rows_of != list(range(len(prompts))):  # every sample of a prompt starts from its prefill
            cache.batch_select_indices(index)
        self.kv.join(cache, mask_PL[index], positions_PL[index, -1], logits_PV[index], budgets)
        self.groups += joining

    def step(self) -> list[Group]:
        """Decode one token for every running row; the requests that finished at it."""
        if self._joining:
            self._prefill_joining()
        if not self.groups:
            return []
        sampled = []
        start = 0
        for g in self.groups:
            a = len(g.active)
            try:
                sampled.append(g.sample(self.kv.logits_AV[start : start + a]))
            except StructuredOutputRefused as e:  # this request's grammar found no way on: it alone ends
                g.error = e
                sampled.append((torch.zeros_like(g.active), torch.ones_like(g.active, dtype=torch.bool)))
            start += a
        self._steps += 1
        interrupted = self.interrupt is not None and self.interrupt.is_set()
        if not (interrupted or self._sync_now()):
            for g, (token_A, done_A) in zip(self.groups, sampled, strict=True):
                g.defer(done_A)
                if g.rules is not None:
                    g.rules.observe(token_A)
                g.t += 1
            self._feed(torch.cat([token_A for token_A, _ in sampled]))
            return []
        ended = [g.ended(done_A) for g, (_, done_A) in zip(self.groups, sampled, strict=True)]
        num_done = int(sum(e.sum() for e, _ in ended))  # the host's sync
        finished, keeps, tokens = [], [], []
        for g, (token_A, _), (gdone_A, length_A) in zip(self.groups, sampled, ended, strict=True):
            if g.error is not None:
                g.done = True
                finished.append(g)
                keeps.append(torch.zeros_like(gdone_A))
                continue
            if num_done:
                for row, length in zip(g.active[gdone_A].tolist(), length_A[gdone_A].tolist(), strict=True):
                    g.lengths[row], g.finish[row] = length, "stop"
            if g.on_tokens is not None:
                try:
                    g.on_tokens(g.active.tolist(), token_A.tolist())
                except Exception:  # a stream's reader gone: its request decodes on, unstreamed
                    log.warning("a request's token stream failed; it goes on without it", exc_info=True)
                    g.on_tokens = None
            ended_all = g.t == g.sampling.max_tokens - 1 or bool(gdone_A.all())
            if ended_all or interrupted:
                if not ended_all:
                    for row in g.active[~gdone_A].tolist():
                        g.lengths[row], g.finish[row] = g.t + 1, "interrupted"
                g.done = True
                finished.append(g)
                keeps.append(torch.zeros_like(gdone_A))
                continue
            keep_A = ~gdone_A
            if num_done:
                g.active, token_A = g.active[keep_A], token_A[keep_A]
                if g.rules is not None:
                    g.rules.keep(keep_A)
            if g.rules is not None:
                g.rules.observe(token_A)
            keeps.append(keep_A)
            tokens.append(token_A)
            g.t += 1
        if finished or num_done:
            self.kv.keep(keeps[0] if len(keeps) == 1 else torch.cat(keeps))
        self.groups = [g for g in self.groups if not g.done]
        if self.groups:
            self._feed(tokens[0] if len(tokens) == 1 else torch.cat(tokens))
        return finished

    def _sync_now(self) -> bool:
        """Whether this step's ends go to the host (see __init__'s sync_every)."""
        return self.sync_every == 1 or self._steps % self.sync_every == 0 or any(
            g.on_tokens is not None or g.grammar is not None or g.t == g.sampling.max_tokens - 1
            for g in self.groups
        )

    def _feed(self, token_A: torch.Tensor) -> None:
        """Feed each running row's sampled token back: the next logits, the routing records."""
        record_ALK = self.kv.feed(token_A)
        if record_ALK is None:
            return
        start = 0
        for g in self.groups:
            a = len(g.active)
            if g.routes is not None:
                g.routes.step(g.active, g.t - 1, record_ALK[start : start + a])
            start += a


class BatchRows(Protocol):
    """Where a running batch's rows keep their KV cache, and the forward that feeds them a token:
    hf_dynamic_batch.DynamicRows (transformers' dynamic cache, rows cut out as they leave) or
    hf_static_batch.StaticRows (slots of a static cache, the step a CUDA graph on a GPU). Rows are
    in the batch's order (each request's rows together, requests in the order they joined)."""

    logits_AV: torch.Tensor
    """Each row's logits for its next token."""

    def join(
        self, cache: DynamicCache, mask_AL: torch.Tensor, positions_A: torch.Tensor, logits_AV: torch.Tensor,
        budgets: list[int],
    ) -> None:  # fmt: skip
        """Rows after the running ones, from their prefill: its cache (one row each, prompts
        left-padded to one width), mask, the last prompt position and the logits; `budgets`: each
        row's max_tokens."""

    def keep(self, keep_A: torch.Tensor) -> None:
        """Only the rows `keep_A` decode on (the others left the batch)."""

    def feed(self, token_A: torch.Tensor) -> torch.Tensor | None:
        """Feed each row its token (one forward): `logits_AV` becomes the next; the forward's routing
        record [A, MoE layers, top_k] when the rows record one."""


class RowRoutes:
    """The routing records of one request's rows: the prefill's (every prompt token) and each
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
