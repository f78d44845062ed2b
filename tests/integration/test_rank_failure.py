"""The line a failed trainer world ends with names the rank that failed, not the first rank that
noticed: a real torchrun world of two gloo ranks in which one rank is killed (-9) or raises, and
the other then fails in its collective ("Connection closed by peer") and writes a line of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlcore.runtime import failure

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RANK = """
import datetime, os, signal, sys
import torch.distributed as dist
from rlcore.runtime import failure

launch_dir, culprit, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
try:
    dist.barrier()
    if rank == culprit:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError(f"rank {rank}'s own problem")
    dist.barrier()  # the other rank: its peer is gone
except Exception as e:
    failure.report(launch_dir, f"rank{rank}", e)
    sys.exit(2 if isinstance(e, ValueError) else 1)
"""


@pytest.mark.parametrize(("culprit", "how"), [(0, "kill"), (1, "kill"), (1, "raise")])
def test_the_line_names_the_rank_that_failed_first(tmp_path, culprit: int, how: str) -> None:
    script, log = tmp_path / "rank.py", tmp_path / failure.TRAINER_LOG
    script.write_text(RANK)
    log.write_text("an earlier world's output\n")
    since = os.path.getsize(log)  # the report of this world only
    with open(log, "a") as err:
        rc = subprocess.run(
            [sys.executable, "-m", "rlcore.runtime.torchrun", "--standalone", "--nproc-per-node", "2", str(script),
             str(tmp_path), str(culprit), how],
            stderr=err, stdout=subprocess.DEVNULL, timeout=150,
        ).returncode  # fmt: skip
    assert rc != 0
    line = failure.world_failure(str(tmp_path), str(log), since)
    assert line is not None
    if how == "kill":
        assert line.startswith(f"trainer rank {culprit} (pid ") and "was ended by SIGKILL" in line, line
    else:
        assert line.startswith(f"rank {culprit}'s own problem (rank{culprit}; full traceback in"), line
