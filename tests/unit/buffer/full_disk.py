"""A real small file system that fills up, for the full-disk tests: a tmpfs mounted for the test
(root only; skipped with the reason otherwise), filled by a file of zeros until the kernel says
ENOSPC, freed by removing that file."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PAGE = 4096


@contextmanager
def small_disk(folder: str, size_k: int) -> Iterator[str]:
    """A tmpfs of `size_k` KiB mounted at `folder` for the block; unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is a tmpfs mounted for the test, which needs root")
    os.makedirs(folder, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_k}k", "tmpfs", folder], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", folder], capture_output=True).returncode:
            subprocess.run(["umount", "-l", folder], check=True)  # a process that still holds a file there


def fill(folder: str, leave: int = 0) -> str:
    """Fill the file system of `folder` to the last page, then free `leave` bytes (whole pages);
    the filler's path (remove it to free the space)."""
    path = os.path.join(folder, f"filler-{len(os.listdir(folder))}")
    with open(path, "ab", buffering=0) as f:
        for chunk in (64 * PAGE, PAGE):
            try:
                while True:
                    f.write(bytes(chunk))
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    if leave:
        os.truncate(path, os.path.getsize(path) - leave)
    return path
