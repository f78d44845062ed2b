"""Admission of generation calls on a rollout worker: counted while they run, refused while closed
(between Pause and Resume, or during a weight update). With partial rollouts, closing also sets
the engine's interrupt: the engine calls running end at their next token and continue once it
opens (rollout/batching.py), instead of holding the weight update until they finish. Direct
Generate calls are never interrupted: they finish first, as without partial rollouts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.rpc.errors import Unavailable


class GenerationGate:
    def __init__(self, interrupts: bool = False) -> None:
        """`interrupts`: partial rollouts (`interrupt`, set while the gate is closed, is what the
        batching engine hands an interruptible engine for its calls)."""
        self.interrupt = threading.Event() if interrupts else None
        self._cond = threading.Condition()
        self.closed = False
        self.active = 0
        """Generation calls running now."""
        self.completed = 0
        self.generated_tokens = 0
        self._busy_s = 0.0
        self._first: float | None = None  # when the first call began
        self._since = 0.0  # when active last went from 0 to 1
        self._last = 0.0  # when active last went back to 0

    @contextmanager
    def admit(self, wait_s: float = 0.0) -> Iterator[None]:
        """Run one generation call unless the gate is closed: then UNAVAILABLE, or first wait up to
        `wait_s` for it to open (a running task's next engine call waits out a weight update)."""
        with self._cond:
            if self.closed and wait_s > 0:
                self._cond.wait_for(lambda: not self.closed, timeout=wait_s)
            if self.closed:
                raise Unavailable("worker paused (Pause or a weight update); retry after Resume")
            if self.active == 0:
                self._since = time.monotonic()
                self._first = self._since if self._first is None else self._first
            self.active += 1
        try:
            yield
        finally:
            with self._cond:
                self.active -= 1
                self.completed += 1
                if self.active == 0:
                    self._last = time.monotonic()
                    self._busy_s += self._last - self._since
                self._cond.notify_all()

    def count(self, num_tokens: int) -> None:
        with self._cond:
            self.generated_tokens += num_tokens

    def close(self) -> None:
        with self._cond:
            self.closed = True
            if self.interrupt is not None:
                self.interrupt.set()

    def open(self) -> None:
        with self._cond:
            self.closed = False
            if self.interrupt is not None:
                self.interrupt.clear()
            self._cond.notify_all()

    def check(self) -> None:
        """UNAVAILABLE while the gate is closed (a call that is about to start)."""
        with self._cond:
            if self.closed:
                raise Unavailable("worker paused (Pause or a weight update); retry after Resume")

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no generation call runs; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.active == 0, timeout=timeout)

    def snapshot(self) -> tuple[bool, int, int, int]:
        """(closed, active, completed, generated_tokens), read together."""
        with self._cond:
            return self.closed, self.active, self.completed, self.generated_tokens

    def busy(self) -> tuple[float, float]:
        """(seconds with a generation call running, seconds from the first call's start to the
        latest's end, or to now while one runs)."""
        with self._cond:
            if self._first is None:
                return 0.0, 0.0
            now = time.monotonic()
            running = now - self._since if self.active else 0.0
            return self._busy_s + running, (now if self.active else self._last) - self._first
