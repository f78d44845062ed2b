"""How the processes of a run end together.

die_with_parent     a child asks the kernel for SIGTERM when its parent dies (kill -9 too):
                    the launcher's children (torchrun, rollout workers) and every trainer rank
                    (whose parent is torchrun) never outlive the process that started them
StopSignals         SIGINT/SIGTERM to the launcher: the first asks the run to stop (the loop
                    checkpoints after its current step and ends); a second signal, or the
                    grace period (control.stop_grace_s) running out, ends it at once
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Get `sig` when the process that started this one dies (Linux; elsewhere nothing happens).
    With `parent_pid`, a parent that is already gone ends this process at once."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


class StopSignals:
    """Handles SIGINT and SIGTERM in the launcher while the run is on (a context manager)."""

    def __init__(self, request_stop: Callable[[], None], grace_s: float):
        self.request_stop, self.grace_s = request_stop, grace_s
        self.received: int | None = None
        """The first signal that arrived (None: none)."""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a second signal: now
            raise KeyboardInterrupt
        self.received = signum
        print(
            f"rlcore: {signal.Signals(signum).name}: stopping after the current step (a checkpoint first); "
            f"again to stop at once",
            file=sys.stderr,
            flush=True,
        )
        # not here: the handler runs in the main thread, which may hold the locks request_stop takes
        threading.Thread(target=self._stop, name="rlcore-stop", daemon=True).start()

    def _stop(self) -> None:
        self.request_stop()
        time.sleep(self.grace_s)
        print(
            f"rlcore: the run did not stop within {self.grace_s:g} s (control.stop_grace_s); ending it now",
            file=sys.stderr,
            flush=True,
        )
        import _thread

        _thread.interrupt_main()

    @property
    def exit_code(self) -> int:
        """128 + the signal, the shell's convention."""
        assert self.received is not None
        return 128 + self.received


def end_process(proc: Any, grace_s: float = 30.0) -> int:
    """SIGTERM a child (torchrun passes it on to the ranks), SIGKILL it after `grace_s`; its code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return int(proc.wait(timeout=grace_s))
    except Exception:  # subprocess.TimeoutExpired
        proc.kill()
        return int(proc.wait())
