"""Stopping a server process on SIGTERM/SIGINT without a deadlock.

A Python signal handler runs in the main thread between two bytecodes, possibly while that thread
holds a lock. `lambda *_: stop.set()` on a threading.Event deadlocks when the main thread is inside
that event's `wait()`, which holds the event's lock on the way in and out: the handler waits for a
lock its own thread holds, and the process never stops (seen: a rollout worker that outlived a
kill -9 of its launcher, stuck in its SIGTERM handler). `StopFlag.handler` takes no lock; the main
thread polls the flag.
"""

from __future__ import annotations

import threading
import time
from types import FrameType

POLL_S = 0.2


class StopFlag:
    def __init__(self) -> None:
        self.signals: list[int] = []
        """The signals received, in order (appending takes no lock)."""

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def wait(self, also: threading.Event | None = None) -> None:
        """Return once a signal arrived (or `also` is set, read without its lock)."""
        while not self.signals and not (also is not None and also.is_set()):
            time.sleep(POLL_S)
