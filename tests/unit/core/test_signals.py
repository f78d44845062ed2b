"""StopFlag: a signal stops the wait without its handler taking any lock."""

from __future__ import annotations

import os
import signal
import threading
import time

from rlcore.core.signals import StopFlag


def test_a_signal_ends_the_wait_and_is_recorded() -> None:
    flag = StopFlag()
    previous = signal.signal(signal.SIGUSR1, flag.handler)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        t0 = time.monotonic()
        flag.wait()
        assert flag.signals == [signal.SIGUSR1] and time.monotonic() - t0 < 5
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_set_event_ends_the_wait_too() -> None:
    flag, event = StopFlag(), threading.Event()
    threading.Timer(0.3, event.set).start()
    flag.wait(also=event)
    assert flag.signals == []


def test_the_handler_does_not_block_while_this_thread_holds_an_events_lock() -> None:
    """What `stop.set()` in a handler would deadlock on: the main thread inside the event's lock."""
    flag, event = StopFlag(), threading.Event()
    with event._cond:  # as Event.wait() holds it on its way in and out
        flag.handler(signal.SIGTERM, None)  # returns at once: no lock taken
    assert flag.signals == [signal.SIGTERM]
