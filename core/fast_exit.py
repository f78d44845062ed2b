"""Ending a process whose work is done without the interpreter's finalization.

A process that imported torch and transformers and loaded a model spends about a second in Python's
finalization after its last line (0.45 s for `import torch` alone, measured here), and every launch
waits for several such exits one after the other: the rollout workers', torchrun's, the launcher's
own. `exit_now` runs what a normal exit runs before finalization (the atexit handlers, logging's
shutdown among them), flushes Python's and C's output buffers, and ends the process.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C and C++ libraries' stdio buffers (os._exit skips exit())
    os._exit(code)
