"""How the processes of a run end together.

die_with_parent     a child asks the kernel for SIGTERM when its parent dies (kill -9 too):
                    the launcher's children (torchrun, rollout workers) and every trainer rank
                    (whose parent is torchrun) never outlive the process that started them
end_process         SIGTERM a child, SIGKILL it after a grace
(SIGINT/SIGTERM to the launcher itself: core/signals.StopSignals, graceful.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
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


def end_process(proc: Any, grace_s: float = 30.0) -> int:
    """SIGTERM a child (torchrun passes it on to the ranks), SIGKILL it after `grace_s`; its code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return int(proc.wait(timeout=grace_s))
    except Exception:  # subprocess.TimeoutExpired
        proc.kill()
        return int(proc.wait())
