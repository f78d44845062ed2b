"""Every failure reaches the user as one line: what failed, where, and the file with the full story.

A failing process of the run (a trainer rank, or the launcher itself) writes its traceback to
`<run>/launch/<who>.traceback.log` and its one line to `<who>.error`; the launcher prints the line
of the rank that failed first (rank 0's when it has one). The ranks' own stderr, torchrun's failure
report included, goes to `<run>/launch/trainer.log`, not to the user's terminal.
"""

from __future__ import annotations

import glob
import os
import traceback

TRAINER_LOG = "trainer.log"


def one_line(error: BaseException) -> str:
    """A user-facing problem (ValueError) as it says itself; anything else with its type."""
    text = " ".join(str(error).split())
    line = text if isinstance(error, ValueError) else f"{type(error).__name__}: {text or 'no message'}"
    return line if len(line) <= 500 else line[:497] + "..."


def report(launch_dir: str, who: str, error: BaseException) -> str:
    """Write `who`'s traceback and one line (which says where the traceback is); return the line."""
    os.makedirs(launch_dir, exist_ok=True)
    trace = os.path.join(launch_dir, f"{who}.traceback.log")
    with open(trace, "w") as f:
        f.write("".join(traceback.format_exception(error)))
    line = f"{one_line(error)} ({who}; full traceback in {trace})"
    with open(os.path.join(launch_dir, f"{who}.error"), "w") as f:
        f.write(line + "\n")
    return line


def first_failure(launch_dir: str) -> str | None:
    """The line of rank 0's failure, else of the rank that failed first; None when none wrote one."""
    found = glob.glob(os.path.join(launch_dir, "rank*.error"))
    if not found:
        return None
    rank0 = os.path.join(launch_dir, "rank0.error")
    first = rank0 if rank0 in found else min(found, key=os.path.getmtime)
    with open(first) as f:
        return f.read().strip()


def clear(launch_dir: str) -> None:
    """Forget an earlier launch's failures (a resume starts with none)."""
    for path in glob.glob(os.path.join(launch_dir, "*.error")):
        os.remove(path)
