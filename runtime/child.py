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
from . import fork_client
from .lifecycle import die_with_parent

KEEP_FREED_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc malloc settings of `cluster.malloc_keep_freed`: never trim the heap; serve blocks up to 32 MiB
(glibc's own ceiling for its adaptive threshold) from it, so a step's activations reuse the last
step's memory instead of page-faulting fresh pages."""


SPIN_WAIT = {"GOMP_SPINCOUNT": "1000"}
"""OpenMP (torch's CPU threads): a thread waiting at a barrier spins 1000 rounds, then sleeps.
libgomp's own default (300,000 rounds, unless it sees more threads than cores) burns the time slices
a waiting thread's partner needs on a machine other processes keep busy: the quickstart's SFT step
beside two busy processes on 2 cores took 12.2 s against 0.25 s with 1000 rounds (0.10-0.14 s alone,
the same losses)."""

FIXED_TEAMS = {"OMP_DYNAMIC": "FALSE", "MKL_DYNAMIC": "FALSE"}
"""OpenMP and MKL run every parallel operation on the threads asked for, never on fewer of their own
choosing: Intel's conditions for MKL's results to be the same from run to run ("set MKL_DYNAMIC and
OMP_DYNAMIC to FALSE"). Runs compared bit for bit (one host against two, a resume against the run
never stopped) rely on it: a gradient norm 1 ulp apart at the first step was seen once in CI between
the same run on one host and across two."""


def thread_settings(env: dict[str, str] | os._Environ = os.environ) -> None:
    """SPIN_WAIT (unless the user set OpenMP's waiting: OMP_WAIT_POLICY or GOMP_SPINCOUNT) and
    FIXED_TEAMS (each unless the user set it) in `env`. Read by libgomp and MKL when torch is
    imported: set where a process starts, before it imports torch (its children inherit them)."""
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env.update(SPIN_WAIT)
    for key, value in FIXED_TEAMS.items():
        env.setdefault(key, value)


QUIET_DATASETS = "HF_DATASETS_DISABLE_PROGRESS_BARS"
"""`datasets` reads this at import; a launch sets it (stderr is for what goes wrong)."""


def quiet_datasets(env: dict[str, str] | os._Environ = os.environ) -> None:
    """Progress bars of `datasets` as QUIET_DATASETS in `env` asks, also where `datasets` was imported
    before it was set (a fork of a warm server that imported it): what a fresh import would read."""
    value = env.get(QUIET_DATASETS)
    if value is None or "datasets" not in sys.modules:
        return
    import datasets

    if value.upper() in ("1", "ON", "YES", "TRUE"):
        datasets.disable_progress_bars()
    else:
        datasets.enable_progress_bars()


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
    if os.environ.get(fork_client.ENV):
        return fork_client.client_command(parent_pid, module, *args)
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
