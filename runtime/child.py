"""`python -m rlcore.runtime.child PARENT_PID -m MODULE ARGS...`: run MODULE as `python -m` would, in a
process that gets SIGTERM when PARENT_PID dies (kill -9 included), and ends at once when it is
gone already. The launcher starts torchrun and the rollout workers this way: no preexec_fn, whose
fork() in a process with gRPC threads running is unsafe."""

from __future__ import annotations

import runpy
import signal
import sys

from .lifecycle import die_with_parent


def wrap(parent_pid: int, module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args` as a child of `parent_pid`."""
    return [sys.executable, "-m", "rlcore.runtime.child", str(parent_pid), "-m", module, *args]


def main() -> None:
    parent, flag, module, *args = sys.argv[1:]
    assert flag == "-m", "usage: python -m rlcore.runtime.child PARENT_PID -m MODULE ARGS..."
    die_with_parent(signal.SIGTERM, int(parent))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
