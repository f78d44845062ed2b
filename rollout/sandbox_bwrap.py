"""The bubblewrap backend of the sandbox (rollout/sandbox.py): the `bwrap` command line that gives the
program a fresh root holding only the folders it may read (read-only) and its own folder (writable),
a /proc and a /dev of its own, new user, pid, ipc, uts, cgroup and network namespaces, and no
capabilities. Bubblewrap is what Flatpak runs its applications in; Debian and Ubuntu package it
(`apt install bubblewrap`). rlcore's own confinement (sandbox_exec.py) still runs inside it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

SKIP = ("/proc", "/dev")
"""Paths bwrap makes itself (--proc, --dev): never bound from the host."""


@functools.cache
def bwrap_path() -> str | None:
    """`bwrap` if it is installed and can make its namespaces here (probed once), else None."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev",
             "/dev", "--", "/bin/sh", "-c", "exit 0"]  # fmt: skip
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return path if ok else None


def command(bwrap: str, folder: str, read_paths: list[str], launcher: str, network: bool) -> list[str]:
    """bwrap's arguments up to and including `--` (the program follows)."""
    argv = [bwrap, "--unshare-all", *(["--share-net"] if network else []), "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev"]  # fmt: skip
    for path in read_paths:
        if path.startswith(SKIP):
            continue
        if os.path.islink(path):  # /lib -> usr/lib on merged-/usr systems
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind-try", path, path]
    return [*argv, "--ro-bind", launcher, launcher, "--bind", folder, folder, "--chdir", folder, "--"]
