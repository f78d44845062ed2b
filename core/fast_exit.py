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
import weakref
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    _skip_op_library_teardown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C and C++ libraries' stdio buffers (os._exit skips exit())
    os._exit(code)


def _skip_op_library_teardown() -> None:
    """Each torch.library.Library (torch's, megatron-core's, vLLM's custom ops) takes its operators
    off the dispatcher at exit, in a weakref finalizer: 0.5 s of a launcher's exit, measured, for a
    process that is about to end. Those finalizers are detached; the others (temporary folders'
    cleanup among them) still run."""
    library = sys.modules.get("torch.library")
    teardown = getattr(library, "_del_library", None)
    if teardown is None:
        return
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        alive = finalizer.peek()
        if alive is not None and alive[1] is teardown:
            finalizer.detach()
