"""exit_now (core/fast_exit.py) ends a process with its exit code after the atexit handlers and the
weakref finalizers that clean up (a temporary folder), but without torch.library's operator
teardown (each Library takes its operators off the dispatcher, for a process about to end)."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = """
import atexit, sys, tempfile, weakref
import torch
from rlcore.core.fast_exit import exit_now

lib = torch.library.Library("rlcore_fast_exit_test", "DEF")
folder = tempfile.TemporaryDirectory()
print(folder.name, flush=True)

def alive_teardowns():
    return sum(1 for f in weakref.finalize._registry if (p := f.peek()) and p[1] is torch.library._del_library)

print("teardowns before", alive_teardowns() > 0, flush=True)
atexit.register(lambda: print("atexit ran; teardowns left", alive_teardowns(), flush=True))
sys.stdout.write("buffered, not flushed")
exit_now(3)
"""


def test_exit_now_runs_the_cleanup_but_not_the_operator_teardown() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    folder = lines[0]
    assert "teardowns before True" in lines
    assert "atexit ran; teardowns left 0" in proc.stdout
    assert "buffered, not flushed" in proc.stdout  # flushed before the process ended
    assert not os.path.exists(folder)  # TemporaryDirectory's finalizer ran
