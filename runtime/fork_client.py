"""The fork server's client (the server: fork_server.py): a process that has the server fork
`python -m module args` for it and stands in for the fork until it ends.

The client sends its command line, environment, working folder, open descriptors and process
settings (CPU affinity, niceness, umask, resource limits); the fork takes them on. The client stays
the process its starter sees: signals sent to it reach the fork (SIGSTOP and SIGCONT too: the server
mirrors the client's stopped state), it ends with the fork's exit code or signal, and when it is
killed the server kills the fork. Where a fresh process would differ from a fork (a variable read
only at start-up differs, another namespace or cgroup, or no server answers), the client execs
Python itself. This module imports only the standard library: a client starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys

from .lifecycle import die_with_parent  # the standard library only, as this module

ENV = "RLCORE_FORK_SERVER"
"""The server's socket, in the environment of the processes whose children it forks."""

RLIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
           "RLIMIT_STACK")  # fmt: skip
"""The resource limits a fork takes from its client (a test's or a sandbox's lowered limits hold)."""

_STAND_IN: int | None = None
"""In a fork, its client's pid (fork_server._become sets it); None in any other process."""


def visible_pid() -> int:
    """This process's pid as the process that started it knows it: its client's in a fork."""
    return _STAND_IN or os.getpid()


def client_command(
    parent: int | None, module: str, *args: str, unbuffered: bool = False, server: str | None = None
) -> list[str]:
    """The command that runs `python [-u] -m module args` through the fork server at `server` (None:
    RLCORE_FORK_SERVER's), as a child that dies with `parent` (None: with whatever started it)."""
    return [
        sys.executable, "-m", "rlcore.runtime.fork_client", "run", server or os.environ[ENV],
        "-" if parent is None else str(parent), *(["-u"] if unbuffered else []), "-m", module, *args,
    ]  # fmt: skip


def hand_over(module: str) -> None:
    """Where RLCORE_FORK_SERVER names a server (a warm one a user or the test suite started), and this
    process is not one of its forks: run `python -m module <this process's arguments>` as a fork and
    end as it ends (this returns only in a fork or where there is no server to hand over to)."""
    path = os.environ.get(ENV)
    if path and _STAND_IN is None:
        run(path, DETACHED, ["-m", module, *sys.argv[1:]], keep_server=False, quiet=True)


def run(path: str, parent: str, argv: list[str], keep_server: bool = True, quiet: bool = False) -> None:
    """The client: have the server fork `argv` (`[-u] -m module args`) and be its stand-in. Where
    it starts Python fresh instead, it says why on stderr (in the child's log; not where `quiet`: a
    command a user typed prints only its own output), and that process keeps RLCORE_FORK_SERVER for
    its own children unless `keep_server` is false."""
    unbuffered = argv[0] == "-u"
    if unbuffered:
        argv = argv[1:]
    assert argv[0] == "-m", "usage: python -m rlcore.runtime.fork_client run SOCKET PARENT [-u] -m MODULE ARGS"
    module, args = argv[1], argv[2:]
    if parent != DETACHED:  # a command a user typed lives on without its shell (nohup), as a fresh one would
        die_with_parent(signal.SIGTERM, None if parent == "-" else int(parent))
    starter = os.getppid()
    fresh = [sys.executable, *(["-u"] if unbuffered else []), "-m", module, *args]

    def start_fresh() -> None:
        if not keep_server:
            os.environ.pop(ENV, None)
        os.execv(sys.executable, fresh)

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
    except OSError:
        start_fresh()  # no server (it ended): a process of its own
    fds = _open_fds(exclude=conn.fileno())
    request = {
        "argv": [module, *args], "env": dict(os.environ), "cwd": os.getcwd(), "unbuffered": unbuffered,
        "fds": [(fd, os.get_inheritable(fd)) for fd in fds], "title": " ".join(fresh), "process": _settings(),
        "pid": os.getpid(),
    }  # fmt: skip
    waiting = False

    def on_signal(signum: int, frame: object) -> None:
        _forward(conn, signum)
        if waiting and orphaned() and conn.gettimeout() is None:
            raise _Orphaned

    def orphaned() -> bool:
        """Whether this client's parent died (its death signal, die_with_parent's, came)."""
        return parent != DETACHED and os.getppid() != starter

    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        for sig in forwarded:  # from now on a signal reaches the fork (the server reads it after the fork)
            signal.signal(sig, on_signal)
        answer = json.loads(conn.recv(4096) or b"{}")
    except (OSError, ValueError):
        answer = {}
    if not answer.get("started"):
        if answer.get("exec") and not quiet:  # in the child's log: why this process imports for itself
            print(f"rlcore: fork server: starting {module} fresh: {answer['exec']}", file=sys.stderr, flush=True)
        conn.close()
        for sig in forwarded:
            signal.signal(sig, signal.SIG_DFL)
        start_fresh()
    waiting = True
    if orphaned():  # the parent died before the wait began
        conn.settimeout(ORPHAN_GRACE_S)
    while True:
        try:
            data = conn.recv(4096)
            break
        except _Orphaned:  # the fork's own ending first; then this end closes and the server kills it
            conn.settimeout(ORPHAN_GRACE_S)
        except TimeoutError:
            os._exit(1)
    code = int(json.loads(data)["exit"]) if data else -signal.SIGKILL  # no answer: the server died
    if code < 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _settings() -> dict[str, object]:
    """What a fresh child would inherit from this process besides its environment and descriptors."""
    umask = os.umask(0o022)
    os.umask(umask)
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in RLIMITS if hasattr(resource, name)}
    return {
        "affinity": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0), "umask": umask,
        "rlimits": limits,
    }  # fmt: skip


DETACHED = "detached"
"""The PARENT of a client that does not die with the process that started it (a command a user
typed); "-": it dies with whatever started it (torchrun's ranks); a pid: with that process."""

ORPHAN_GRACE_S = 10.0
"""How long a client whose parent died waits for its fork to end on the signal it passed on before
it ends itself, and so the fork (the server kills a fork whose client is gone): a fresh child would
have died with its parent by the signal it chose (a trainer rank: SIGKILL), which the fork cannot
choose relative to the client's parent."""


class _Orphaned(Exception):
    """The signal a client got was its parent's death (die_with_parent)."""


def _forward(conn: socket.socket, signum: int) -> None:
    try:
        conn.send(str(int(signum)).encode())
    except OSError:
        pass


def _open_fds(exclude: int) -> list[int]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == exclude:
            continue
        try:
            os.fstat(fd)
        except OSError:  # listdir's own descriptor, closed by now
            continue
        found.append(fd)
    return sorted(found)


def main() -> None:
    command, path, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if command != "run":
        raise SystemExit(f"usage: python -m rlcore.runtime.fork_client run SOCKET PARENT [-u] -m MODULE ARGS; got {command!r}")
    run(path, rest[0], rest[1:])


if __name__ == "__main__":
    main()
