"""Hosts on one machine for multi-host tests: Linux network namespaces joined by a bridge.

Each `Host` is a namespace with one interface (eth0) on 10.<net>.0.0/24 and its own loopback;
processes started with `host.popen(...)` see only that interface, so traffic between hosts goes
over the bridge, and `host.cut()` / `host.restore()` bring its link down and up (a pulled cable:
packets are dropped, no connection is reset). Creating namespaces needs root (CAP_NET_ADMIN);
`skip_reason()` says why a machine cannot, for the tests to skip with.

Leaving a host set checks that no process outlives the test there (an orphan fails the test).
Everything is named after this process's id and a count of the sets it made, and removed by
`close()` (the bridge and the veths go with it), so parallel or aborted sessions do not collide,
nor does a set with the remains of the one before (a namespace lives on while a process of it
does, and its interface with it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def skip_reason() -> str | None:
    """None when this machine can create network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "multi-host tests need the `ip` command (iproute2) to create network namespaces"
    if os.geteuid() != 0:
        return "multi-host tests create network namespaces, which needs root (CAP_NET_ADMIN)"
    probe = f"rlprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Host:
    def __init__(self, netns: str, address: str, veth: str):
        self.netns, self.address, self.veth = netns, address, veth

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def pids(self) -> list[int]:
        """The processes that live in this host's namespace."""
        return [int(pid) for pid in _ip("netns", "pids", self.netns, check=False).stdout.split()]

    def cut(self) -> None:
        """Pull the cable: the host's end of the link goes down (its packets are dropped)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")


class Hosts:
    """`count` hosts on a private bridge; use as a context manager (removes them all on exit)."""

    made = 0

    def __init__(self, count: int, net: int = 77):
        Hosts.made += 1
        tag = f"{os.getpid() % 100000}{Hosts.made % 100:02d}"  # interface names: 15 characters at most
        self.bridge = f"rlbr{tag}"
        self.hosts: list[Host] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for i in range(count):
                netns, veth = f"rlh{tag}-{i}", f"rlv{tag}-{i}"
                _ip("netns", "add", netns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                address = f"10.{net}.0.{i + 1}"
                _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", netns, "link", "set", "eth0", "up")
                _ip("-n", netns, "link", "set", "lo", "up")
                self.hosts.append(Host(netns, address, veth))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> list[Host]:
        return self.hosts

    def __exit__(self, exc_type: object, *exc: object) -> None:
        left = self.leftovers()
        self.close()
        if left and exc_type is None:  # a failing test's own error comes first
            raise AssertionError(f"processes outlived the test in its hosts (orphans): {left}")

    def leftovers(self, wait_s: float = 60.0) -> list[str]:
        """What still runs in the hosts once `wait_s` has passed (the processes a test ended take
        their children with them, within their grace periods), as command lines; these are killed."""
        import time

        deadline = time.monotonic() + wait_s
        while any(h.pids() for h in self.hosts) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = []
        for host in self.hosts:
            for pid in host.pids():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        left.append(
                            f"{host.address} pid {pid}: " + f.read().replace(b"\0", b" ").decode()[:300]
                        )
                    os.kill(pid, 9)
                except OSError:
                    continue
        return left

    def close(self) -> None:
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)  # its eth0 goes with it, and so the veth pair
        self.hosts = []
        _ip("link", "del", self.bridge, check=False)
