"""The fork server: the Python processes a launch starts (rollout workers, torchrun, trainer ranks)
forked from one process that imported torch and transformers once, instead of each importing them
for itself (about 9 s of one core each on a 2-core machine, most of a short launch's wall time).

The launcher forks the server once it has imported torch (`ForkServer`, on by default on CPU:
`cluster.fork_server`); the server imports the rest (PRELOAD) and the launcher puts its socket in
RLCORE_FORK_SERVER. A child the launcher starts is then a small client process
(`child.wrap`: python with nothing but the standard library imported) that sends the server its
command line, environment, working folder and open descriptors; the server forks, the fork takes
them on (its descriptors at the same numbers, its environment, its thread count, its title in `ps`)
and runs the module as `python -m` would. The client stays the process its starter sees: signals
sent to it reach the fork, it ends with the fork's exit code or signal, and when the client is
killed the server kills the fork. Where a fresh process would differ from a fork (an environment
variable read only at start-up changed, or no server answers), the client execs Python itself.

Torchrun's ranks come through the same door (`torchrun --no-python python -m
rlcore.runtime.fork_server run ...`). This module imports only the standard library: its client
must start in milliseconds.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
from typing import Any

from .lifecycle import die_with_parent  # the standard library only, as this module

ENV = "RLCORE_FORK_SERVER"
"""The server's socket, in the environment of the launcher and so of its children."""

PRELOAD = (
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.checkpoint",
    "torch.distributed.elastic.multiprocessing", "torch.distributed.launcher.api", "transformers",
    "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.modeling_utils", "grpc", "grpc_health.v1.health", "google.protobuf", "omegaconf",
    "rlcore.core.config",
)  # fmt: skip
"""What the server imports before it forks: what every child needs and takes seconds (never a module
a child runs as __main__, which runpy would warn is imported already)."""

SET_AFTER_FORK = frozenset({
    "OMP_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "PYTHONUNBUFFERED",
    "PYTHONFAULTHANDLER",
})  # fmt: skip
"""Start-up settings a fork takes on after the fork (torch's threads, mallopt, its stdio)."""

READ_AT_START = frozenset({
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONWARNINGS", "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDEVMODE", "PYTHONMALLOC",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES",
})  # fmt: skip
"""Variables the interpreter and the loader read only when a process starts: a child whose value
differs from the server's is started fresh (exec), not forked. (The launch sets no other variable
for its children that the server's imports read; libraries that set defaults at import, as
threadpoolctl's KMP_DUPLICATE_LIB_OK, change the launcher's environment, not what a fork needs.)"""

_MAX_FDS = 250  # the kernel passes at most 253 descriptors in one message
_MAX_REQUEST = 4 << 20


def _start_up_differs(env: dict[str, str], own: dict[str, str]) -> list[str]:
    """The start-up variables in which `env` differs from `own` (the server's before its imports,
    some of which set variables: torch sets TORCHINDUCTOR_CACHE_DIR)."""
    keys = set(env) | set(own)
    return sorted(
        k for k in keys if k in READ_AT_START and env.get(k) != own.get(k)
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- server


def wanted(cluster: Any) -> bool:
    """cluster.fork_server: on, off, or auto: on where the run's device is the CPU (cpu, or auto on a
    machine without NVIDIA devices): forks of a process that touched CUDA are not measured yet."""
    if cluster.fork_server != "auto":
        return bool(cluster.fork_server == "on")
    import glob

    return bool(cluster.device == "cpu" or (cluster.device == "auto" and not glob.glob("/dev/nvidia[0-9]*")))


class ForkServer:
    """The launcher's fork server, for as long as the context lasts (a no-op where `enabled` is
    false or the platform lacks what it needs: Linux pidfds)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.platform.startswith("linux") and hasattr(os, "pidfd_open")
        self._pid: int | None = None
        self._dir = ""

    def __enter__(self) -> ForkServer:
        if not self.enabled or os.environ.get(ENV):
            return self
        self._dir = tempfile.mkdtemp(prefix="rlcore-fork-")  # 0700: only this user reaches the socket
        path = os.path.join(self._dir, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)  # here: a child started from now on finds it (and waits for the imports)
        listener.listen(64)
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()  # what this process imported already, the server has without importing it again
        if pid == 0:
            try:
                os.setsid()  # a terminal's Ctrl-C reaches the launcher, which ends the run in order
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.close(devnull)
                host(path, parent, listener.fileno())
            finally:
                os._exit(1)
        listener.close()
        self._pid = pid
        os.environ[ENV] = path
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pid is None:
            return
        os.environ.pop(ENV, None)
        os.kill(self._pid, signal.SIGTERM)  # its forks get SIGTERM with it, as they would with the launcher
        os.waitpid(self._pid, 0)
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)


def host(path: str, parent: int, fd: int) -> None:
    """Serve forks on the listening socket `fd` (bound at `path`) until the launcher `parent` dies
    (or ends it). Runs in a fork of the launcher: it imports what the launcher has not."""

    def end(signum: int, frame: Any) -> None:
        import shutil

        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    die_with_parent(signal.SIGTERM, parent)
    listener = socket.socket(fileno=fd)  # clients that come during the imports wait in its backlog
    own = dict(os.environ)
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    try:  # set up here, while the environment is the process's own: a fork's title replaces it
        import setproctitle

        setproctitle.setproctitle(f"rlcore-fork-server of process {parent} ({path})")
    except ImportError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    forks: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, client connection)
    conns: dict[int, tuple[int, int]] = {}  # connection fd -> (pid, pidfd)
    sockets: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener.fileno(), *forks, *conns], [], [])
        for fd in ready:
            if fd == listener.fileno():
                conn, _ = listener.accept()
                started = _fork_for(conn, own)
                if started is None:
                    conn.close()
                    continue
                pid = started
                pidfd = os.pidfd_open(pid)
                forks[pidfd] = (pid, conn)
                conns[conn.fileno()] = (pid, pidfd)
                sockets[conn.fileno()] = conn
            elif fd in forks:
                pid, conn = forks.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                conns.pop(conn.fileno(), None)
                sockets.pop(conn.fileno(), None)
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()
            elif fd in conns:
                pid, _ = conns[fd]
                try:
                    data = sockets[fd].recv(64)
                except OSError:
                    data = b""
                sig = int(data) if data else signal.SIGKILL  # an empty read: the client is gone
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                if not data:
                    conns.pop(fd)
                    sockets.pop(fd)


def _fork_for(conn: socket.socket, own: dict[str, str]) -> int | None:
    """Fork for the request on `conn`; the fork's pid, or None (refused: the client execs)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    try:
        data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, _MAX_FDS)
    except OSError:
        return None
    if uid != os.getuid() or not data:
        for fd in fds:
            os.close(fd)
        return None
    try:
        request = json.loads(data)
        differs = _start_up_differs(request["env"], own)
    except (ValueError, KeyError, TypeError):
        differs = ["(a request it cannot read)"]
    if differs:
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"exec": f"{', '.join(differs)} differ(s) from the launcher's at its start"}).encode())
        return None
    pid = os.fork()
    if pid == 0:
        try:
            _become(request, fds)
        except BaseException:  # noqa: BLE001 - a fork never returns into the server's loop
            import traceback

            traceback.print_exc()
            os._exit(70)
    for fd in fds:
        os.close(fd)
    conn.send(b'{"started": true}')
    return pid


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the fork: take on the client's descriptors, environment and settings, run its module."""
    os.setsid()
    die_with_parent(signal.SIGTERM)  # the server ends with the launcher; its forks then end as its children do
    numbers = request["fds"]  # [(number in the client, inheritable)], in the order of `fds`
    high = max([n for n, _ in numbers] + [int(n) for n in os.listdir("/proc/self/fd")]) + 1
    held = [_fcntl_dup(fd, high) for fd in fds]  # above every descriptor open now
    os.closerange(0, high)  # the server's own (its socket, the other clients') and the originals
    for (number, inheritable), fd in zip(numbers, held, strict=True):
        os.dup2(fd, number, inheritable=bool(inheritable))
    for fd in held:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _settings(request["env"], request["unbuffered"])
    argv = request["argv"]
    _run_module(argv[0], argv[1:], request["title"])


def _fcntl_dup(fd: int, at_least: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, at_least)


def _settings(env: dict[str, str], unbuffered: bool) -> None:
    """What a fresh process would have set up from its environment and flags at start-up."""
    import io

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            setattr(sys, name, None)
            continue
        tty = os.isatty(fd)
        if fd == 0:
            stream: Any = io.TextIOWrapper(open(0, "rb", closefd=False), line_buffering=tty)
        else:
            raw = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
            stream = io.TextIOWrapper(
                raw, line_buffering=tty or fd == 2, write_through=unbuffered,
                errors="backslashreplace" if fd == 2 else "strict",
            )  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    if "OMP_NUM_THREADS" in env and "torch" in sys.modules:
        try:
            sys.modules["torch"].set_num_threads(max(1, int(env["OMP_NUM_THREADS"])))
        except ValueError:
            pass
    libc: Any = None
    for key, option in (("MALLOC_TRIM_THRESHOLD_", -1), ("MALLOC_MMAP_THRESHOLD_", -3)):
        if key in env:
            import ctypes

            libc = libc or ctypes.CDLL(None)
            libc.mallopt(option, int(env[key]))


def _run_module(module: str, args: list[str], title: str) -> None:
    import runpy
    import threading

    try:
        import setproctitle

        setproctitle.setproctitle(title)  # `ps` and psutil show the command, not the server's
    except ImportError:
        pass
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()
    code: Any = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # as at a normal exit: non-daemon threads end first
    except BaseException:  # noqa: BLE001
        pass
    import atexit

    atexit._run_exitfuncs()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if code < 0:  # ended by a signal, as a fresh interpreter ends on Ctrl-C
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


# ---------------------------------------------------------------------------------------- client


def client_command(parent: int | None, module: str, *args: str, unbuffered: bool = False) -> list[str]:
    """The command that runs `python [-u] -m module args` through the fork server (RLCORE_FORK_SERVER),
    as a child that dies with `parent` (None: with whatever started it)."""
    return [
        sys.executable, "-m", "rlcore.runtime.fork_server", "run", os.environ[ENV],
        "-" if parent is None else str(parent), *(["-u"] if unbuffered else []), "-m", module, *args,
    ]  # fmt: skip


def run(path: str, parent: str, argv: list[str]) -> None:
    """The client: have the server fork `argv` (`[-u] -m module args`) and be its stand-in."""
    unbuffered = argv[0] == "-u"
    if unbuffered:
        argv = argv[1:]
    assert argv[0] == "-m", "usage: python -m rlcore.runtime.fork_server run SOCKET PARENT [-u] -m MODULE ARGS"
    module, args = argv[1], argv[2:]
    die_with_parent(signal.SIGTERM, None if parent == "-" else int(parent))
    fresh = [sys.executable, *(["-u"] if unbuffered else []), "-m", module, *args]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
    except OSError:
        os.execv(sys.executable, fresh)  # no server (it ended): a process of its own
    fds = _open_fds(exclude=conn.fileno())
    request = {
        "argv": [module, *args], "env": dict(os.environ), "cwd": os.getcwd(), "unbuffered": unbuffered,
        "fds": [(fd, os.get_inheritable(fd)) for fd in fds], "title": " ".join(fresh),
    }  # fmt: skip
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], fds)
        for sig in forwarded:  # from now on a signal reaches the fork (the server reads it after the fork)
            signal.signal(sig, lambda signum, frame: _forward(conn, signum))
        answer = json.loads(conn.recv(4096) or b"{}")
    except (OSError, ValueError):
        answer = {}
    if not answer.get("started"):
        if answer.get("exec"):  # in the child's log: why this process imports for itself
            print(f"rlcore: fork server: starting {module} fresh: {answer['exec']}", file=sys.stderr, flush=True)
        conn.close()
        for sig in forwarded:
            signal.signal(sig, signal.SIG_DFL)
        os.execv(sys.executable, fresh)
    while True:
        try:
            data = conn.recv(4096)
            break
        except InterruptedError:
            continue
    code = int(json.loads(data)["exit"]) if data else -signal.SIGKILL  # no answer: the server died
    if code < 0:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


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
        raise SystemExit(f"usage: python -m rlcore.runtime.fork_server run SOCKET PARENT [-u] -m MODULE ARGS; got {command!r}")
    run(path, rest[0], rest[1:])


if __name__ == "__main__":
    main()
