"""How every rlcore process stops on SIGINT/SIGTERM: one mechanism, `StopSignals`.

A Python signal handler runs in the main thread between two bytecodes, possibly while that thread
holds a lock. `lambda *_: stop.set()` on a threading.Event deadlocks when the main thread is inside
that event's `wait()`, which holds the event's lock on the way in and out: the handler waits for a
lock its own thread holds, and the process never stops (seen: a rollout worker that outlived a
kill -9 of its launcher, stuck in its SIGTERM handler). So the handler records the signal and takes
no lock; what the process does about it happens elsewhere, in one of three ways:

  polled     (default) the main thread polls `received` or `wait`s: servers (`rlcore rollout serve`,
             `trainer serve`'s rank 0, `tinker serve`)
  graceful   `request_stop` runs in a thread of its own at the first signal (the locks it takes may be
             the main thread's); a second signal, or `grace_s` passing first, interrupts the main
             thread (KeyboardInterrupt): `rlcore launch`, which stops after its current step
  at once    `at_once`: the handler raises KeyboardInterrupt in the main thread, as Python's own SIGINT
             handler does: processes whose main thread only waits on a child (a trainer node)
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

POLL_S = 0.2
STOPPING = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """SIGINT and SIGTERM (or `signals`) handled as the module's docstring says, while the context
    lasts (the previous handlers come back at its end); `announce`: a line printed at the first."""

    def __init__(
        self,
        request_stop: Callable[[], None] | None = None,
        grace_s: float | None = None,
        *,
        at_once: bool = False,
        signals: Iterable[int] = STOPPING,
        announce: str = "",
    ):
        if at_once and request_stop is not None:
            raise ValueError("StopSignals: at_once interrupts at the first signal; it takes no request_stop")
        self.request_stop, self.grace_s, self.at_once, self.announce = request_stop, grace_s, at_once, announce
        self.handled = tuple(signals)
        self.signals: list[int] = []
        """The signals received, in order (appending takes no lock)."""
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        """Handle the signals from now on (the main thread only, as Python requires)."""
        for sig in self.handled:
            self._previous[sig] = signal.signal(sig, self.handler)
        return self

    def restore(self) -> None:
        """Put back the handlers `install` replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    @property
    def received(self) -> int | None:
        """The first signal that arrived (None: none yet)."""
        return self.signals[0] if self.signals else None

    @property
    def exit_code(self) -> int:
        """128 + the first signal, the shell's convention (130 before any)."""
        return 128 + (self.received or signal.SIGINT)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        first = len(self.signals) == 1
        if first and self.announce:
            print(f"rlcore: {signal.Signals(signum).name}: {self.announce}", file=sys.stderr, flush=True)
        if self.at_once or (not first and self.request_stop is not None):
            raise KeyboardInterrupt
        if first and self.request_stop is not None:
            threading.Thread(target=self._stop, name="rlcore-stop", daemon=True).start()

    def wait(self, also: threading.Event | None = None) -> None:
        """Return once a signal arrived (or `also` is set, read without its lock)."""
        while not self.signals and not (also is not None and also.is_set()):
            time.sleep(POLL_S)

    def _stop(self) -> None:
        assert self.request_stop is not None
        self.request_stop()
        if self.grace_s is None:
            return
        time.sleep(self.grace_s)
        print(
            f"rlcore: the run did not stop within {self.grace_s:g} s (control.stop_grace_s); ending it now",
            file=sys.stderr,
            flush=True,
        )
        import _thread

        _thread.interrupt_main()
