"""A trainer rank's log records: rlcore's on stdout, the libraries' on stderr (the run's trainer.log)
unless log.level is DEBUG. Each case runs in a fresh interpreter, whose logging nothing else touched."""

from __future__ import annotations

import subprocess
import sys

import pytest

EMIT = """
import logging, sys
from rlcore.runtime import rank_logs
rank_logs.configure(int(sys.argv[1]), sys.argv[2])
logging.getLogger("rlcore.runtime.loop").info("step 1 done")
logging.getLogger("megatron.core.distributed").info("Params for bucket 1 (4 parameters)")
logging.getLogger("torch.distributed").warning("a library warning")
"""
LIBRARY = ("Params for bucket 1", "a library warning")


def run(rank: int, level: str) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, "-c", EMIT, str(rank), level], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_library_records_go_to_stderr_unless_debug(level: str) -> None:
    out, err = run(0, level)
    assert "step 1 done" in out and "[rank0]" in out
    if level == "DEBUG":
        assert all(text in out for text in LIBRARY) and err == ""
    else:
        assert all(text in err for text in LIBRARY) and not any(text in out for text in LIBRARY)


def test_other_ranks_log_warnings_only() -> None:
    out, err = run(1, "INFO")
    assert out == "" and "a library warning" in err and "bucket" not in err
