"""Generation calls of concurrent tasks on one engine, decoded together.

A rollout worker runs each RunTasks stream (and each door request) in a thread of its own. Its
workflows generate through a `BatchingEngine`. Where the engine has a running batch (continuous
batching: engines/base.EngineBatch, the HF engine's eager loop), one loop thread steps it while
there is work: a call joins it at the next token boundary, with its own sampling, and returns as
soon as its rows end (calls with the same sampling join as one request, and return together). Elsewhere a call made while
the engine is busy waits, and whichever waiting call goes next takes every queued call with the same
sampling parameters into one engine call. Either way tasks sent one by one (the explorer's task
scheduler, rollout/scheduler.py) are batched as a whole batch would be, and a task's reward or
environment step runs while the engine generates for the others instead of holding it. Engines seed
each prompt by itself (engines/base.py: prompt_seed), so a prompt samples the same whatever it is
batched with.

Each engine call (a running batch's stretch from its first call to its last) passes the worker's
generation gate: a weight update waits for the engine call running, not for whole tasks (a running
batch admits no call while an update waits), and a task's next engine call waits for the update to finish (its
tokens then come from the new weights, their log-probs with them: the trainer's off-policy
correction reads each token's own). A task is tagged with the version it started on.

Partial rollouts (a gate that interrupts, and an interruptible engine): a weight update does not
wait for the engine call either. The call ends at its next token, the update loads, and each
unfinished sequence continues from its tokens so far under the new weights (its KV cache
recomputed by the continuation's prefill); the completion's `segments` name the version of each
stretch, and its log-probs are each token's under the weights that sampled it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.types import Completion, SamplingParams, StructuredOutput, routing_tokens
from .engines.base import EngineBatch, RolloutEngine, TokensOut, response_text
from .gate import GenerationGate

log = logging.getLogger("rlcore.rollout.batching")

GATE_WAIT_S = 600.0
"""How long an engine call of a running task waits for a weight update (or a Pause) to end."""


@dataclass(eq=False)
class _Call:
    prompts: list[list[int]]
    sampling: SamplingParams
    linger_s: float = 0.0
    on_tokens: TokensOut | None = None
    result: list[list[Completion]] | None = None
    error: BaseException | None = None
    version: int = -1
    """The policy version of the weights that generated `result`."""
    done: bool = field(default=False)


class BatchingEngine:
    """`engine` behind `lock` (the worker's engine lock, which weight updates also take), with
    concurrent `generate` calls merged. Everything else is the engine's."""

    def __init__(self, engine: RolloutEngine, lock: threading.Lock, gate: GenerationGate | None = None):
        self.engine = engine
        self.lock = lock
        self.gate = gate
        self._cond = threading.Condition()
        self._queue: list[_Call] = []
        self._leading = False
        self.calls = 0
        """Engine calls made (a test's and a metric's view of how much was merged)."""
        self.interrupted = 0
        """Sequences continued after a weight update interrupted them (partial rollouts)."""
        self._batch = engine.continuous_batch()
        self._loop: threading.Thread | None = None
        self.steps = 0
        """Decode steps of the running batch (continuous batching)."""
        self.step_rows = 0
        """Sequences those steps held, summed (over `steps`: the mean batch size)."""
        self._running_rows = 0
        self._wanted = 0  # threads waiting in `exclusive`

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self.generate_versioned(prompt_token_ids, sampling)[0]

    def generate_versioned(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, linger_s: float = 0.0,
        on_tokens: TokensOut | None = None,
    ) -> tuple[list[list[Completion]], int]:  # fmt: skip
        """`generate`, and the policy version of the weights that began the completions (a sequence a
        weight update interrupted names the versions of its stretches in `segments`). `linger_s`: a
        call that finds the engine idle waits this long for others to join it (the HTTP door's
        requests arrive one by one; the explorer's tasks queue while the engine runs). `on_tokens`:
        called with each step's tokens as they are sampled (rows, tokens; row r is prompt r // n,
        sample r % n), where the engine has a running batch (else never: the completions say all)."""
        results, version = self._generate_once(prompt_token_ids, sampling, linger_s, on_tokens)
        if any(c.finish_reason == "interrupted" for cs in results for c in cs):
            self._continue([c for cs in results for c in cs], sampling, version)
        return results, version

    def _continue(self, completions: list[Completion], sampling: SamplingParams, version: int) -> None:
        """Continue the interrupted `completions` in place, once the weight update is done (the
        gate's admission waits for it), from their tokens so far: each continuation's prompt is the
        prompt and those tokens, its budget what max_tokens and min_tokens leave. Sequences with the
        same tokens so far continue as one prompt's samples (so their draws differ), and continue
        again if interrupted again. A structured output's grammar takes the tokens so far first
        (the vllm engine does not interrupt those: its grammar cannot resume)."""
        for c in completions:
            if c.finish_reason == "interrupted":
                c.segments = [(version, len(c.token_ids))]
        while todo := [c for c in completions if c.finish_reason == "interrupted"]:
            self.interrupted += len(todo)
            log.info("continuing %d sequence(s) a weight update interrupted", len(todo))
            by_done: dict[int, dict[tuple[int, ...], list[Completion]]] = {}
            for c in todo:  # as many tokens so far: one engine call; the same tokens: one prompt's samples
                prefixes = by_done.setdefault(len(c.token_ids), {})
                prefixes.setdefault(tuple(c.prompt_token_ids + c.token_ids), []).append(c)
            for done, prefixes in by_done.items():
                for n in sorted({len(group) for group in prefixes.values()}):
                    groups = [(p, g) for p, g in prefixes.items() if len(g) == n]
                    more = replace(sampling, n=n, max_tokens=sampling.max_tokens - done,
                                   min_tokens=max(0, sampling.min_tokens - done),
                                   prompt_logprobs=sampling.prompt_logprobs and done == 0,
                                   structured_output=resumed(sampling.structured_output, done))  # fmt: skip
                    outs, now = self._generate_once([list(p) for p, _ in groups], more)
                    for (_, group), samples in zip(groups, outs, strict=True):
                        for c, o in zip(group, samples, strict=True):
                            c.routed_experts = joined_routing(c, o)
                            c.token_ids, c.logprobs = c.token_ids + o.token_ids, c.logprobs + o.logprobs
                            c.top_logprobs = c.top_logprobs + o.top_logprobs
                            if not c.prompt_logprobs:  # interrupted before its prefill: the continuation's
                                c.prompt_logprobs = o.prompt_logprobs[: len(c.prompt_token_ids) - 1]
                            c.finish_reason = o.finish_reason
                            c.segments.append((now, len(o.token_ids)))
        for c in completions:
            if c.segments:
                c.text = response_text(self.engine.tokenizer, c.token_ids, sampling.stop)

    def _generate_once(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, linger_s: float = 0.0,
        on_tokens: TokensOut | None = None,
    ) -> tuple[list[list[Completion]], int]:  # fmt: skip
        """One engine call's share: the completions as the engine returned them, and its version."""
        call = _Call([list(p) for p in prompt_token_ids], sampling, linger_s, on_tokens)
        if self._batch is not None:
            return self._through_loop(call)
        with self._cond:
            self._queue.append(call)
            idle = not self._leading
            while not call.done and self._leading:
                self._cond.wait()
            if not call.done:
                self._leading = True
        if not call.done:
            try:
                if idle and linger_s > 0:  # calls that queued behind a running one go at once
                    time.sleep(linger_s)
                self._serve(sampling)
            finally:
                with self._cond:
                    self._leading = False
                    self._cond.notify_all()
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result, call.version

    def _serve(self, sampling: SamplingParams) -> None:
        """One engine call for every queued call with `sampling` (the leader's own among them)."""
        admitted = self.gate.admit(GATE_WAIT_S) if self.gate is not None else nullcontext()
        batch: list[_Call] = []
        try:
            with admitted, self.lock:
                batch = self._take(sampling)
                self.engine.interrupt = None if self.gate is None else self.gate.interrupt
                try:
                    results = self.engine.generate([p for c in batch for p in c.prompts], sampling)
                finally:
                    self.engine.interrupt = None
                version = self.engine.policy_version
                self.calls += 1
        except BaseException as e:  # every merged call sees the error (the gate's, the engine's)
            for c in batch or self._take(sampling):  # refused before taking them: those calls fail
                c.error, c.done = e, True
            return
        start = 0
        for c in batch:
            c.result, c.version, c.done = results[start : start + len(c.prompts)], version, True
            start += len(c.prompts)

    # ------------------------------------------------------------------------------------------
    # continuous batching: one loop thread steps the engine's running batch while there is work

    def _through_loop(self, call: _Call) -> tuple[list[list[Completion]], int]:
        with self._cond:
            self._queue.append(call)
            if self._loop is None:
                self._loop = threading.Thread(target=self._run_loop, name="rlcore-engine-loop", daemon=True)
                self._loop.start()
            self._cond.notify_all()
            while not call.done:
                self._cond.wait()
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result, call.version

    def _run_loop(self) -> None:
        """Step the running batch while calls wait or run (under the gate and the engine lock); the
        thread ends when the queue is empty. A weight update waiting (the gate closed) admits no
        new call: the running ones finish (or, interrupted, end at their next token) first."""
        assert self._batch is not None
        while True:
            with self._cond:
                if not self._queue:
                    self._loop = None
                    return
                linger_s = max(c.linger_s for c in self._queue)
            if linger_s > 0:  # an idle engine: let the calls arriving now share the first prefill
                time.sleep(linger_s)
            with self._cond:  # an `exclusive` holder waiting for the lock goes first
                self._cond.wait_for(lambda: not self._wanted)
            try:
                admitted = self.gate.admit(GATE_WAIT_S) if self.gate is not None else nullcontext()
                with admitted, self.lock:
                    self.engine.interrupt = None if self.gate is None else self.gate.interrupt
                    try:
                        self._drain(self._batch)
                    finally:
                        self.engine.interrupt = None
            except BaseException as e:  # the gate's refusal: every call waiting sees it
                with self._cond:
                    waiting, self._queue = self._queue, []
                for c in waiting:
                    self._deliver(c, error=e)

    def _drain(self, batch: EngineBatch) -> None:
        """Admit queued calls into `batch` and step it until no call runs. No call is admitted
        while a weight update waits (the gate closed) or another holder of the engine lock does
        (`exclusive`): the running ones finish, and the lock goes to it."""
        running: dict[int, list[_Call]] = {}
        self.calls += 1
        try:
            while True:
                if (self.gate is None or not self.gate.closed) and not self._wanted:
                    self._admit(batch, running)
                    if not running and (alone := self._take_one()) is not None:  # one no batch can hold
                        self._serve_alone(alone)
                        continue
                if not running:
                    return
                rows = batch.rows
                finished = batch.step()
                self.steps, self.step_rows, self._running_rows = self.steps + 1, self.step_rows + rows, batch.rows
                for request, completions in finished.items():
                    if isinstance(completions, Exception):  # that request's own failure
                        for c in running.pop(request, []):
                            self._deliver(c, error=completions)
                        continue
                    start = 0
                    for c in running.pop(request, []):
                        self._deliver(c, completions[start : start + len(c.prompts)])
                        start += len(c.prompts)
        except Exception as e:  # the engine's error (the batch ended): every running call sees it
            for calls in running.values():
                for c in calls:
                    self._deliver(c, error=e)
        finally:
            self._running_rows = 0

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the engine lock for work beside generation (a direct Generate, loading an adapter):
        the running batch admits no new call meanwhile, so the lock comes free once its calls end."""
        with self._cond:
            self._wanted += 1
        try:
            with self.lock:
                yield
        finally:
            with self._cond:
                self._wanted -= 1
                self._cond.notify_all()

    def queue_depth(self) -> int:
        """Generation calls waiting for the engine."""
        with self._cond:
            return len(self._queue)

    def running_rows(self) -> int:
        """Sequences the running batch decodes now (as of its last step)."""
        return self._running_rows

    def _admit(self, batch: EngineBatch, running: dict[int, list[_Call]]) -> None:
        """Queued calls into the running batch in arrival order, until one it cannot admit yet (no
        room, another adapter): that one goes first once the batch has drained, so none waits for
        ever behind later calls. Calls with the same sampling join as one request (their rows then
        share the sampler's work)."""
        while True:
            with self._cond:
                if not self._queue or not batch.admits(len(self._queue[0].prompts), self._queue[0].sampling):
                    return
                first, calls, prompts = self._queue[0], [], 0
                for c in self._queue:
                    if c is not first and not _joins(first.sampling, c):
                        continue
                    if batch.admits(prompts + len(c.prompts), c.sampling):
                        calls.append(c)
                        prompts += len(c.prompts)
                self._queue = [c for c in self._queue if c not in calls]
            try:
                running[batch.add([p for c in calls for p in c.prompts], first.sampling, _fanned(calls))] = calls
            except Exception as e:  # the engine refused a prompt: each call alone, so only its own fails
                if len(calls) == 1:
                    self._deliver(first, error=e)
                    continue
                for c in calls:
                    try:
                        running[batch.add(c.prompts, c.sampling, c.on_tokens)] = [c]
                    except Exception as e:
                        self._deliver(c, error=e)

    def _take_one(self) -> _Call | None:
        with self._cond:
            return self._queue.pop(0) if self._queue else None

    def _serve_alone(self, call: _Call) -> None:
        """A call larger than the running batch holds: one `generate`, which splits it."""
        try:
            self._deliver(call, self.engine.generate(call.prompts, call.sampling))
        except Exception as e:
            self._deliver(call, error=e)

    def _deliver(
        self, call: _Call, result: list[list[Completion]] | None = None, error: BaseException | None = None
    ) -> None:
        with self._cond:
            call.result, call.error, call.version, call.done = result, error, self.engine.policy_version, True
            self._cond.notify_all()

    def _take(self, sampling: SamplingParams) -> list[_Call]:
        """The queued calls with `sampling` (the first alone when it asks for structured output: its
        grammar's failure is its own), out of the queue."""
        with self._cond:
            batch = [c for c in self._queue if c.sampling == sampling]
            batch = batch[:1] + [c for c in batch[1:] if _joins(sampling, c)]
            self._queue = [c for c in self._queue if c not in batch]
        return batch


def _joins(sampling: SamplingParams, call: _Call) -> bool:
    """Whether `call` may share one engine request with a call under `sampling`: the same sampling,
    and no structured output (a grammar's failure is its own call's)."""
    return call.sampling == sampling and sampling.structured_output is None


def _fanned(calls: list[_Call]) -> TokensOut | None:
    """One request's `on_tokens` for the calls merged into it: each call's rows to its own (row r
    of the request is prompt r // n; the calls' prompts follow one another)."""
    if not any(c.on_tokens for c in calls):
        return None
    n = calls[0].sampling.n
    starts, first = [], 0
    for c in calls:
        starts.append(first * n)
        first += len(c.prompts)

    def fan(rows: list[int], tokens: list[int]) -> None:
        for c, start in zip(calls, starts, strict=True):
            mine = [(r - start, t) for r, t in zip(rows, tokens, strict=True) if start <= r < start + len(c.prompts) * n]
            if c.on_tokens is not None and mine:
                c.on_tokens([r for r, _ in mine], [t for _, t in mine])

    return fan


def resumed(spec: StructuredOutput | None, done: int) -> StructuredOutput | None:
    """A continuation's structured output: its grammar first takes the `done` tokens so far."""
    return None if spec is None else replace(spec, resumed=done)


def joined_routing(before: Completion, continued: Completion) -> bytes:
    """The routing record of `before` continued by `continued` (whose prompt is before's prompt and
    tokens): before's record of the tokens it ran, then the continuation's of the rest (its prefill
    ran before's last token, under the new weights)."""
    if not continued.token_ids:  # interrupted again before it began: nothing new was run
        return before.routed_experts
    if not continued.routed_experts:
        return b""
    if not before.routed_experts:  # interrupted before its engine call began: the continuation ran it all
        return continued.routed_experts
    per_token = len(continued.routed_experts) // routing_tokens(
        len(continued.prompt_token_ids), len(continued.token_ids)
    )
    kept = routing_tokens(len(before.prompt_token_ids), len(before.token_ids)) * per_token
    return before.routed_experts[:kept] + continued.routed_experts[kept:]
