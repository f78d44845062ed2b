"""Every failure reaches the user as one line: what failed, where, and the file with the full story.

A failing process of the run (a trainer rank, or the launcher itself) writes its traceback to
`<run>/launch/<who>.traceback.log` and its one line to `<who>.error`. The ranks' own stderr,
torchrun's failure report included, goes to `<run>/launch/trainer.log`, not to the user's terminal.
When the trainer world fails the launcher prints the line of the rank that failed first, as
torchrun's report names it (`world_failure`): its own words when it wrote them, else how it ended (a
rank killed by a signal writes nothing) — never the line of a rank that only saw it go.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import traceback

TRAINER_LOG = "trainer.log"
MAX_CHARS = 500
"""The longest line of an error that is not a ValueError (a library's, which may carry a dump)."""


def one_line(error: BaseException) -> str:
    """A user-facing problem (ValueError) as it says itself, whole (its end says what to do); anything
    else with its type, its middle cut past MAX_CHARS (the start says what, the end often where)."""
    text = " ".join(str(error).split())
    if isinstance(error, ValueError):
        return text
    line = f"{type(error).__name__}: {text or 'no message'}"
    return line if len(line) <= MAX_CHARS else f"{line[: MAX_CHARS * 2 // 3]} ... {line[-MAX_CHARS // 3 :]}"


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


_FAILED = re.compile(r"^\S+ FAILED$", re.MULTILINE)
_ENTRY = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.DOTALL)
ROOT_CAUSE = "Root Cause (first observed failure):"
SIGNAL_HINTS = {
    "SIGKILL": "killed from outside, or by the kernel's out-of-memory killer: see `dmesg`",
    "SIGTERM": "stopped from outside",
    "SIGSEGV": "a crash in native code",
    "SIGBUS": "a crash in native code, or shared memory (/dev/shm) full",
    "SIGABRT": "an abort in native code",
}


def failed_ranks(log_path: str, since: int = 0) -> list[tuple[int, int, int, bool]]:
    """(rank, exit code, pid, root cause) of each failure in the last torchrun report written to
    `log_path` from byte `since` on (the world started then); [] when there is none."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    heads = list(_FAILED.finditer(text))
    if not heads:
        return []
    report = text[heads[-1].end() :]
    cause_at = report.find(ROOT_CAUSE)
    return [(int(m[1]), int(m[2]), int(m[3]), 0 <= cause_at < m.start()) for m in _ENTRY.finditer(report)]


def world_failure(launch_dir: str, log_path: str, since: int = 0) -> str | None:
    """The one line of a failed trainer world: of the rank that failed first by torchrun's report
    (one ended by the agent's own SIGTERM only when no other failed), its .error line when it wrote
    one, else how it ended; without a report, `first_failure`. A rank ended by a signal comes before
    one that exited: the others fail as a consequence (their peer is gone), never by a signal, and
    torchrun may time a rank's own error before it notices the killed one."""
    entries = failed_ranks(log_path, since)
    own = [e for e in entries if e[1] != -signal.SIGTERM] or entries  # the agent SIGTERMs the rest
    if not own:
        return first_failure(launch_dir)
    signalled = [e for e in own if e[1] < 0]
    rank, code, pid, _ = next((e for e in signalled or own if e[3]), (signalled or own)[0])
    line = os.path.join(launch_dir, f"rank{rank}.error")
    if os.path.exists(line):
        with open(line) as f:
            return f.read().strip()
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        ended = f"was ended by {name} ({SIGNAL_HINTS.get(name, 'a signal')})"
    else:
        ended = f"exited with code {code} without saying why"
    return (
        f"trainer rank {rank} (pid {pid}) {ended}; the other ranks were stopped with it; resume with "
        f"continue_from_checkpoint=true (torchrun's report: {log_path})"
    )
