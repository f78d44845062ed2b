"""Where a fork server's client lives: the namespaces, cgroup and root folder it runs in. A fork
enters the client's network, hostname, IPC and mount namespaces (setns(2), as root: `ip netns exec`
gives its command a network namespace and a mount namespace of its own); a client apart from the
server in any other way (another pid or user namespace, cgroup or root folder: a container) starts
fresh instead, as the fork would live where the server does."""

from __future__ import annotations

import ctypes
import os

JOINABLE = {"net": 0x40000000, "uts": 0x04000000, "ipc": 0x08000000, "mnt": 0x00020000}
"""The namespaces a fork can enter after the fact, with their CLONE_NEW* flags (setns's nstype).
The mount namespace last: entering it resets the fork's folder, which it then takes from its client."""

APART = ("pid", "user", "cgroup")
"""Namespaces a fork cannot take on: its pid namespace is fixed when it is born, and entering a user
or cgroup namespace would not move it out of the server's cgroup or its credentials."""


def place(client: int) -> tuple[list[str], list[str]]:
    """(how `client` lives apart from this process in ways a fork cannot follow, the namespaces of
    JOINABLE a fork must enter to be where it is). Without root, a client in another network, hostname
    or IPC namespace is apart (its mount namespace is then not compared: `ip netns exec` makes one
    that differs in /sys only)."""
    apart, join = [], []
    can_join = os.geteuid() == 0
    for ns in (*APART, *JOINABLE):
        try:
            differs = os.stat(f"/proc/{client}/ns/{ns}").st_ino != os.stat(f"/proc/self/ns/{ns}").st_ino
        except OSError:
            continue
        if not differs:
            continue
        if ns in JOINABLE and can_join:
            join.append(ns)
        elif ns != "mnt":
            apart.append(f"its {ns} namespace")
    try:
        with open(f"/proc/{client}/cgroup") as theirs, open("/proc/self/cgroup") as mine:
            if theirs.read() != mine.read():
                apart.append("its cgroup")
        their_root, my_root = os.stat(f"/proc/{client}/root"), os.stat("/proc/self/root")
        if (their_root.st_dev, their_root.st_ino) != (my_root.st_dev, my_root.st_ino):  # not times that may change
            apart.append("its root folder")
    except OSError:
        pass
    return apart, join


def open_namespaces(client: int, join: list[str]) -> list[tuple[int, int]]:
    """Descriptors of `client`'s namespaces named in `join` (opened by the server while the client
    waits for its answer), with their flags, for `enter`."""
    return [(os.open(f"/proc/{client}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC), JOINABLE[ns]) for ns in join]


def enter(namespaces: list[tuple[int, int]]) -> None:
    """Move this (single-threaded, just forked) process into `namespaces` and close their descriptors."""
    if not namespaces:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for fd, flag in namespaces:
        if libc.setns(fd, flag) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the client's namespace (flag {flag:#x}): {os.strerror(err)}")
        os.close(fd)
