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

from ..core.config import ConfigError

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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _describe(os.read(fd, 4096))
            os.close(fd)
            raise ConfigError(
                f"the run folder {os.path.dirname(os.path.dirname(self.path))} belongs to a live run ({owner}): "
                "stop it first, or start a new run with name=<new name>"
            ) from None
        previous = os.read(fd, 4096)
        record = {"host": socket.gethostname(), "pid": os.getpid(),
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
