"""How the launcher starts its children (torchrun, rollout workers): with their environment
(`process_env`), and as children that die with it.

`python -m rlcore.runtime.child PARENT_PID -m MODULE ARGS...` runs MODULE as `python -m` would, in a
process that gets SIGTERM when PARENT_PID dies (kill -9 included), and ends at once when it is
gone already: no preexec_fn, whose fork() in a process with gRPC threads running is unsafe."""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Any

from ..core.fast_exit import exit_now
from . import fork_server
from .lifecycle import die_with_parent

KEEP_FREED_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc malloc settings of `cluster.malloc_keep_freed`: never trim the heap; serve blocks up to 32 MiB
(glibc's own ceiling for its adaptive threshold) from it, so a step's activations reuse the last
step's memory instead of page-faulting fresh pages."""


def rank_threads(cluster: Any) -> int:
    """CPU threads of each trainer rank: cluster.threads_per_rank, else the cores split between the
    node's ranks."""
    return int(cluster.threads_per_rank or max(1, (os.cpu_count() or 1) // cluster.ranks_per_node))


def process_env(cluster: Any, threads: int, gpus: list[str] | None = None) -> dict[str, str]:
    """The environment of the trainer ranks and rollout workers a launch starts; `gpus` (placed by
    `gpu_placement`) replace CUDA_VISIBLE_DEVICES."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    user_malloc = "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ)
    if cluster.malloc_keep_freed and not user_malloc:
        env.update(KEEP_FREED_MALLOC)
    return env


def wrap(parent_pid: int, module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args` as a child of `parent_pid`: forked by the
    launch's fork server where one runs (fork_server.py), else a process of its own."""
    if os.environ.get(fork_server.ENV):
        return fork_server.client_command(parent_pid, module, *args)
    return [sys.executable, "-m", "rlcore.runtime.child", str(parent_pid), "-m", module, *args]


def main() -> None:
    parent, flag, module, *args = sys.argv[1:]
    assert flag == "-m", "usage: python -m rlcore.runtime.child PARENT_PID -m MODULE ARGS..."
    die_with_parent(signal.SIGTERM, int(parent))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    exit_now(0)  # the module returned: done (torchrun; an error raises, or exits with its code, first)


if __name__ == "__main__":
    main()
