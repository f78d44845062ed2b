"""One run, one owner: `rlcore launch` holds an exclusive lock on `<run>/launch/owner.lock` for as
long as any process of the run that inherited it lives (the launcher, torchrun, the rollout
workers), and writes its host, pid and start time into the file.

The lock is the kernel's (flock): it goes with the last process holding it, kill -9 included, so
a second launch on a live run is refused by the kernel, and a lock file left by a dead owner is
taken over (with a warning naming it). The lock is as reliable as the file system's flock: local
file systems, and NFS v4.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import time

from ..core.config import ConfigError
from .fork_client import visible_pid

LOCK_FILE = "owner.lock"


class RunLock:
    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, "launch", LOCK_FILE)
        self.fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock or raise ConfigError naming the live owner. Returns a line about the dead
        owner whose lock was taken over, if any."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _lock_exclusive(fd)
        except BlockingIOError:
            owner = _describe(os.read(fd, 4096))
            os.close(fd)
            raise ConfigError(
                f"the run folder {os.path.dirname(os.path.dirname(self.path))} belongs to a live run ({owner}): "
                "stop it first, or start a new run with name=<new name>"
            ) from None
        previous = os.read(fd, 4096)
        record = {"host": socket.gethostname(), "pid": visible_pid(),  # the pid its starter knows
                  "started": datetime.datetime.now().isoformat(timespec="seconds")}  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        self.fd = fd
        if previous.strip():
            return f"took over the run folder from {_describe(previous)}, which is gone"
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # the lock goes with the last process that inherited it
            self.fd = None


def _describe(raw: bytes) -> str:
    try:
        owner = json.loads(raw)
        return f"rlcore launch pid {owner['pid']} on host {owner['host']}, started {owner['started']}"
    except (ValueError, KeyError, TypeError):
        return "an rlcore launch that left no owner record"


def _lock_exclusive(fd: int) -> None:
    """flock(LOCK_EX | LOCK_NB), tried for up to a second: the other launch of a decoupled run
    probes this lock (`is_held`) with a shared lock held for microseconds."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def is_held(path: str) -> bool | None:
    """Whether a live process holds the run lock at `path` (None: no such file, or the file
    system cannot say)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # ENOLCK and the like (a network file system without locks)
        return None
    finally:
        os.close(fd)  # our shared lock, if we got it, goes with the descriptor
    return False


class PeerLaunch:
    """The other launch of a decoupled run (the mode-train launch for an explorer, the explore
    launch for its trainer), watched through its run lock. It may end and be started again (a
    resume) while this one waits: `poll` says when it went, and when it came back."""

    def __init__(self, run_dir: str, what: str):
        self.path, self.what = os.path.join(run_dir, "launch", LOCK_FILE), what
        self.alive: bool | None = None
        """Whether it held its lock when last looked at (None: not seen yet)."""

    def poll(self, waits_s: float) -> str | None:
        """A line to say when the peer launch was seen to go (its lock free after it held it) or to
        come back; None otherwise. `waits_s`: how long this launch goes on waiting for it."""
        held = bool(is_held(self.path))
        was, self.alive = self.alive, held if (held or self.alive is not None) else None
        if was and not held:
            return (
                f"the {self.what} of this run is gone: its lock {self.path} is free (it ended, or died); waiting up "
                f"to {waits_s:g} s (experience_buffer.max_wait_s) for it to be started again with "
                "continue_from_checkpoint=true"
            )
        if was is False and held:
            return f"the {self.what} of this run is back"
        return None
