"""The rollout workers a stage generates on, followed as the launch keeps them: the one worker
failover of the lock-step trainer (runtime/engine_link.py), the explorer (runtime/explore_loop.py)
and the explorer's thread (runtime/buffer_source.py).

- A worker that stopped answering (in a call, RemoteRollout.drop; or when it was joined) is left out.
  While the run still lists it, it is tried again RETRY_UNREACHABLE_S after it was left out: its link
  may be back. Configured endpoints (explorer.rollout_model.endpoints), which nothing restarts, stay
  out once they stop answering.
- Workers the launch restarted (at new addresses) are taken in; those it removed are left out.
- When none answers, `await_restarted` waits as long as the launch's restarts may take.

The pool keeps one RemoteRollout and changes it in place (the explorer and the task scheduler hold it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..client.base import RpcError
from ..core.config.schema import RLCoreConfig
from .remote import LOST, RemoteRollout

log = logging.getLogger("rlcore.loop")

RETRY_UNREACHABLE_S = 5.0
"""A worker the run lists but that did not answer when last tried is left out this long, then tried
again: its link may be back while this side's gRPC connection still waits out its reconnect backoff
(seen: a rollout host whose cut link returned answered its heartbeats but not the first GetInfo)."""


class WorkerPool:
    def __init__(
        self, cfg: RLCoreConfig, endpoints: list[str], listed: Callable[[], list[str] | None] | None = None,
        skip_unreachable: bool = False,
    ):  # fmt: skip
        """`endpoints`: the workers to start on; `listed()`: the workers the launch keeps alive as the
        run lists them now (restarted ones at new addresses; None back: unknown now, keep the current
        ones), None where nothing restarts them (configured endpoints). `skip_unreachable`: leave out
        a worker of `endpoints` that does not answer, instead of failing."""
        self.cfg, self.listed = cfg, listed
        self.rollout = RemoteRollout(cfg, endpoints, skip_unreachable=skip_unreachable)
        self.serving = self.addresses
        """The workers as the last `follow` left them."""
        self.left_at: dict[str, float] = {}
        """Workers left out (time.monotonic when): tried again after RETRY_UNREACHABLE_S while listed."""
        self.joined: list[str] = []
        """The workers the last `follow` took in (they hold other weights than the others)."""
        self._were: list[str] = []
        self._unanswered: list[str] = []
        self._note_left_out()

    @property
    def addresses(self) -> list[str]:
        return [c.address for c in self.rollout.clients]

    @property
    def managed(self) -> bool:
        """Whether the launch restarts the workers (else they are configured endpoints)."""
        return self.listed is not None

    def follow(self, wait: bool = False) -> bool:
        """Take the workers as the run lists them now: without the ones it removed or that stopped
        answering, with the restarted ones and with those due to be tried again. `wait`: when none
        serves and none is to be tried, wait for the launch to restart one (`await_restarted`).
        Whether the workers changed since the last follow (said in the log)."""
        listed = self.listed() if self.listed is not None else None
        self._note_left_out()
        self._unanswered = []
        current = self.addresses
        if listed is None:  # unknown now (or configured endpoints): the workers we have
            listed = current
        self.rollout.forget([a for a in current if a not in listed])
        now = time.monotonic()
        due = [a for a in listed if a not in current and now - self.left_at.get(a, -1e9) >= RETRY_UNREACHABLE_S]
        if not self.managed:
            due = []
        if wait and not self.addresses and not due:
            due = self.await_restarted()
        self.joined = self._join(due) if due else []
        for address in [a for a in self.left_at if a not in listed and a not in due]:
            del self.left_at[address]  # the launch removed it
        self._were, self.serving = self.serving, self.addresses
        if self.serving == self._were:
            return False
        log.info("rollout workers now: %s (were: %s)", ", ".join(self.serving), ", ".join(self._were))
        return True

    def leave_out_silent(self) -> list[str]:
        """Ask each serving worker whether it is there (after a call to all of them failed); leave out
        those that do not answer, and return their addresses. An answer that is an error raises."""
        gone = []
        for client in list(self.rollout.clients):
            try:
                client.get_info(timeout=min(30.0, self.cfg.explorer.max_timeout))
            except RpcError as e:
                if e.code.name not in LOST:
                    raise
                gone.append(client.address)
        self.rollout.forget(gone)
        return gone

    def _join(self, addresses: list[str]) -> list[str]:
        """Connect to `addresses`; those that answer serve from now on (returned), the others are left out."""
        fresh = RemoteRollout(self.cfg, addresses, skip_unreachable=True)
        now = time.monotonic()
        self._unanswered = list(fresh.lost)
        for address in addresses:
            if address in fresh.lost:
                self.left_at[address] = now
            else:
                self.left_at.pop(address, None)
                if address in self.rollout.lost:
                    self.rollout.lost.remove(address)
        joined = [c.address for c in fresh.clients]
        if fresh.clients:
            self.rollout.adopt(fresh)
        else:
            fresh.close()
        return joined

    def _note_left_out(self) -> None:
        """The workers RemoteRollout left out since the last look, and when."""
        now = time.monotonic()
        for address in self.rollout.lost:
            self.left_at.setdefault(address, now)

    def await_restarted(self, stop: threading.Event | None = None, then: str = "") -> list[str]:
        """No worker answers: the addresses the run lists besides those that stopped (restarted
        workers come back at new ones), waited for as long as the launch's restarts may take
        (backoff 1, 2, ... 2^max_restarts s, then a start within control.worker_start_timeout);
        [] where it restarts none (configured endpoints, explorer.rollout_model.max_restarts 0), on
        `stop`, or past that. `then`: what follows, for the log."""
        rm = self.cfg.explorer.rollout_model
        if self.listed is None or rm.max_restarts == 0:
            return []
        self._note_left_out()
        gone = [*self.rollout.lost, *(a for a in [*self.left_at, *self.serving] if a not in self.rollout.lost)]
        budget_s = 2.0**rm.max_restarts + self.cfg.control.worker_start_timeout
        log.warning(
            "no rollout worker answers: waiting up to %.0f s for the launch to restart one (%s stopped answering: "
            "dead, or hung past its deadline)%s", budget_s, ", ".join(gone) or "every one", then,
        )  # fmt: skip
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            fresh = [a for a in self.listed() or [] if a not in gone]
            if fresh:
                return fresh
            if stop is not None:
                stop.wait(0.5)
            else:
                time.sleep(0.5)
        return []

    def none_answer(self) -> str:
        """Why the stage cannot go on after a `follow` left no worker: who stopped, and why none took over."""
        rm = self.cfg.explorer.rollout_model
        if self._unanswered:
            why = f"{', '.join(self._unanswered)} do(es) not answer"
        else:
            why = "none is registered with the run"
            if self.listed is not None:
                why += (
                    f" (the launch restarts each at most {rm.max_restarts} time(s): explorer.rollout_model.max_restarts)"
                )
        stopped = self._were or self.rollout.lost
        return f"no rollout worker answers: {', '.join(stopped) or 'none'} stopped, and {why}"

    def close(self) -> None:
        self.rollout.close()
