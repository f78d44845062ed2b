"""Deadlines for work that cannot be interrupted from Python (a stuck generate, a stuck collective):
when the deadline passes, print one line naming what stalled and the config key that bounds it,
dump every thread's stack, and exit the process — a clear error instead of a silent hang."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float, what: str, key: str) -> Iterator[None]:
    def expire() -> None:
        print(
            f"rlcore: error: {what} did not finish within {seconds:g} s (raise {key} if it is just slow)",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
