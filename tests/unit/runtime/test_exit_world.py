"""A rank leaves through exit_world: groups destroyed, atexit handlers run, output flushed, its
code returned, and no interpreter finalization (where gloo threads that outlive
destroy_process_group can abort it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

RANK = textwrap.dedent(
    """
    import ctypes, logging, logging.handlers, multiprocessing, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    import torch._dynamo  # after the group exists: it keeps the group alive past destroy
    from rlcore.runtime.trainer_world import exit_world

    dist.all_reduce(torch.ones(4))
    # as megatron-core's checkpoint writer does: a spawned manager process, which holds this
    # process's stdout and stderr open until multiprocessing's atexit handler shuts it down
    manager = multiprocessing.get_context("spawn").Manager()
    # a buffering handler: its records reach the file only when logging is shut down
    target = logging.FileHandler(sys.argv[1])
    logging.getLogger("rank").addHandler(logging.handlers.MemoryHandler(100, target=target))
    logging.getLogger("rank").warning("logged")
    sys.stdout.write("written")  # a pipe: block-buffered, lost by os._exit unless flushed
    ctypes.CDLL(None).printf(b" by C")  # C's own stdout buffer, flushed by exit() and not os._exit
    exit_world(3)
    """
)


def test_exit_world_reaps_children_flushes_and_exits_with_the_code(tmp_path) -> None:
    log = tmp_path / "rank.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    # capture_output waits for every holder of the pipes: an orphaned manager would hang it
    proc = subprocess.run(
        [sys.executable, "-c", RANK, str(log)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout == "written by C", proc.stdout
    assert "logged" in log.read_text()
