"""Generation calls of concurrent tasks on one engine, merged into shared engine calls.

A rollout worker runs each RunTasks stream in a thread of its own. Its workflows generate through a
`BatchingEngine`: a call made while the engine is busy waits, and whichever waiting call goes next
takes every queued call with the same sampling parameters into one engine call. So tasks sent one
by one (the explorer's task scheduler, rollout/scheduler.py) are batched as a whole batch would be,
and a task's reward or environment step runs while the engine generates for the others instead of
holding it. Engines seed each prompt by itself (engines/base.py: prompt_seed), so a prompt samples
the same whatever it is merged with.

Each engine call passes the worker's generation gate: a weight update waits for the engine call
running, not for whole tasks, and a task's next engine call waits for the update to finish (its
tokens then come from the new weights, their log-probs with them: the trainer's off-policy
correction reads each token's own). A task is tagged with the version it started on.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..core.types import Completion, SamplingParams
from .engines.base import RolloutEngine
from .gate import GenerationGate

GATE_WAIT_S = 600.0
"""How long an engine call of a running task waits for a weight update (or a Pause) to end."""


@dataclass(eq=False)
class _Call:
    prompts: list[list[int]]
    sampling: SamplingParams
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self.generate_versioned(prompt_token_ids, sampling)[0]

    def generate_versioned(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, linger_s: float = 0.0
    ) -> tuple[list[list[Completion]], int]:
        """`generate`, and the policy version of the weights that generated the completions.
        `linger_s`: a call that finds the engine idle waits this long for others to join it (the
        HTTP door's requests arrive one by one; the explorer's tasks queue while the engine runs)."""
        call = _Call([list(p) for p in prompt_token_ids], sampling)
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
                results = self.engine.generate([p for c in batch for p in c.prompts], sampling)
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

    def _take(self, sampling: SamplingParams) -> list[_Call]:
        """The queued calls with `sampling`, out of the queue."""
        with self._cond:
            batch = [c for c in self._queue if c.sampling == sampling]
            self._queue = [c for c in self._queue if c.sampling != sampling]
        return batch
