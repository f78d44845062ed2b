"""The remote trainer's service (trainer.remote: a TrainerService, or a Tinker service) watched while
the loop drives it from the launch process (remote_loop.drive_remote).

    lost    the service is probed every control.heartbeat_interval (any answer counts, even an
            error; a probe waits at most that long); after two heartbeats without an answer the
            run ends at once, wherever the loop waits (a trainer call, rollouts sampling from the
            service, a sync), in one line naming the service and what to do
    stop    SIGINT/SIGTERM (core/signals.StopSignals) asks the run to finish its step first; while
            the service does not answer that step cannot end, so the run stops now, as a second
            signal would

Why a watch and not deadlines on the calls: a call may rightly take long (a queued step on a busy
service), and the Tinker SDK retries a lost connection for ever (its futures poll with backoff up
to 30 s, its RetryConfig gives up after progress_timeout, 2 hours); what says a service is gone is
that it no longer answers at all. The main thread is woken by a signal (WAKE), since a wait
without a timeout (a future's result, a lock) sees neither `_thread.interrupt_main` nor a flag.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

WAKE = signal.SIGUSR2
"""Sent to the main thread to raise the watch's exception there."""
MISSED_HEARTBEATS = 2
"""Heartbeats without an answer after which the service is lost."""
STOP_PROBE_S = 3.0
"""Longest a stop request waits for the service to answer (at most control.heartbeat_interval)."""
TICK_S = 0.2


class ServiceLost(ConnectionError):
    """The remote trainer's service stopped answering; str() is the one line the launch prints."""


class _Silent(BaseException):
    """What the watch raises in the main thread, wherever it waits; the watch's exit turns it into
    ServiceLost. A BaseException, as KeyboardInterrupt is and for the same reason: no `except
    Exception` on the way (a rollout's retries) may take it for a failed call and try again."""


def lost(service: str, why: str) -> ServiceLost:
    """The error of a service that stopped answering, `why` saying how that showed."""
    return ServiceLost(f"{service} stopped answering ({why}): restart it, then resume the run with "
                       "continue_from_checkpoint=true")  # fmt: skip


class ServiceWatch:
    """A context manager, entered in the main thread: the thread that probes the service."""

    def __init__(
        self, service: str, answers: Callable[[float], bool], interval_s: float, stopping: Callable[[], bool]
    ):  # fmt: skip
        """`service`: what the lines call it ("the Tinker service at http://..."); `answers(timeout_s)`:
        whether it answered a probe within `timeout_s`; `stopping`: whether the run was asked to stop."""
        self.service, self.answers, self.interval_s, self.stopping = service, answers, interval_s, stopping
        self.answering = True
        """False once the watch found the service silent (nothing more is worth waiting for there)."""
        self._lock = threading.Lock()
        self._done = False
        self._pending: BaseException | None = None
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="rlcore-service-watch", daemon=True)
        self._previous: Any = None

    def __enter__(self) -> ServiceWatch:
        assert threading.current_thread() is threading.main_thread(), "signals reach the main thread only"
        if not self.answers(self.interval_s):
            self.answering = False
            raise ServiceLost(
                f"{self.service} does not answer: start it (or check the address), then launch again"
            )
        self._previous = signal.signal(WAKE, self._raise)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        try:
            self._end()
        except _Silent as late:  # the WAKE sent as the body ended
            self._end()
            error = late
        if isinstance(error, _Silent):
            raise ServiceLost(str(error)) from error

    def _end(self) -> None:
        with self._lock:  # no WAKE is sent, nor raised, once the watch has ended
            self._done = True
            self._pending = None
        signal.signal(WAKE, self._previous)

    def _raise(self, signum: int, frame: FrameType | None) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            raise pending

    def _interrupt(self, error: BaseException, line: str = "") -> None:
        """Raise `error` in the main thread (unless the watch has ended), `line` printed first."""
        with self._lock:
            if self._done:
                return
            self.answering = False
            if line:
                print(line, file=sys.stderr, flush=True)
            self._pending = error
            assert self._main is not None
            signal.pthread_kill(self._main, WAKE)

    def _watch(self) -> None:
        answered = time.monotonic()
        due = answered + self.interval_s
        stop_probed = False
        while not self._done:
            time.sleep(TICK_S)
            stop = self.stopping()
            if not (stop and not stop_probed) and time.monotonic() < due:
                continue
            stop_probed |= stop  # a stop request probes at once, with a shorter wait
            due = time.monotonic() + self.interval_s
            if self.answers(min(STOP_PROBE_S, self.interval_s) if stop else self.interval_s):
                answered = time.monotonic()
                continue
            silent_s = time.monotonic() - answered
            if self.stopping():  # as a second signal would: the launch says where the run stopped
                line = f"rlcore: {self.service} does not answer: stopping now, without waiting for its calls"
                return self._interrupt(KeyboardInterrupt(), line)
            if silent_s >= MISSED_HEARTBEATS * self.interval_s:
                why = f"{silent_s:.0f} s without an answer; probed every control.heartbeat_interval, {self.interval_s:g} s"
                return self._interrupt(_Silent(str(lost(self.service, why))))
