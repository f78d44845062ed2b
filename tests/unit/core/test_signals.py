"""StopSignals, the one way rlcore processes stop: a signal is recorded without its handler taking any
lock (polled), asks for a stop in a thread and interrupts after the grace or at a second signal
(graceful), or interrupts at once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rlcore.core.signals import StopSignals


def test_a_signal_ends_the_wait_and_is_recorded_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with StopSignals(signals=(signal.SIGUSR1,)) as stops:
        assert signal.getsignal(signal.SIGUSR1) == stops.handler
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        t0 = time.monotonic()
        stops.wait()
        assert stops.signals == [signal.SIGUSR1] and time.monotonic() - t0 < 5
        assert stops.received == signal.SIGUSR1 and stops.exit_code == 128 + signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before


def test_a_set_event_ends_the_wait_too() -> None:
    stops, event = StopSignals(), threading.Event()
    threading.Timer(0.3, event.set).start()
    stops.wait(also=event)
    assert stops.signals == [] and stops.received is None


def test_the_handler_does_not_block_while_this_thread_holds_an_events_lock() -> None:
    """What `stop.set()` in a handler would deadlock on: the main thread inside the event's lock."""
    stops, event = StopSignals(), threading.Event()
    with event._cond:  # as Event.wait() holds it on its way in and out
        stops.handler(signal.SIGTERM, None)  # returns at once: no lock taken
    assert stops.signals == [signal.SIGTERM]


def test_graceful_asks_for_a_stop_in_a_thread_then_a_second_signal_interrupts(capsys) -> None:
    asked = threading.Event()
    stops = StopSignals(asked.set, grace_s=None, announce="stopping after the current step")
    stops.handler(signal.SIGTERM, None)  # as the signal would, in this (the main) thread
    assert asked.wait(5) and stops.received == signal.SIGTERM
    assert capsys.readouterr().err == "rlcore: SIGTERM: stopping after the current step\n"
    with pytest.raises(KeyboardInterrupt):
        stops.handler(signal.SIGINT, None)
    assert stops.received == signal.SIGTERM and stops.exit_code == 128 + signal.SIGTERM


def test_graceful_interrupts_the_main_thread_once_its_grace_has_passed(capsys) -> None:
    """The interruption arrives as a SIGINT of the process's own (_thread.interrupt_main), which the
    installed handler turns into KeyboardInterrupt as it would a second signal from outside."""
    t0 = time.monotonic()
    with StopSignals(lambda: None, grace_s=0.2) as stops:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # a main loop's short waits (the interruption arrives between two)
                time.sleep(0.1)
    assert time.monotonic() - t0 < 5 and "did not stop within 0.2 s" in capsys.readouterr().err
    assert stops.signals == [signal.SIGTERM, signal.SIGINT] and stops.exit_code == 128 + signal.SIGTERM


def test_at_once_interrupts_at_the_first_signal() -> None:
    stops = StopSignals(at_once=True)
    with pytest.raises(KeyboardInterrupt):
        stops.handler(signal.SIGTERM, None)
    assert stops.received == signal.SIGTERM
    with pytest.raises(ValueError, match="at_once interrupts at the first signal"):
        StopSignals(lambda: None, at_once=True)
