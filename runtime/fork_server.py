"""The fork server: the Python processes a launch starts (rollout workers, torchrun, trainer ranks)
forked from one process that imported torch and transformers once, instead of each importing them
for itself (about 9 s of one core each on a 2-core machine, most of a short launch's wall time).

The launcher forks the server once it has imported torch (`ForkServer`, `cluster.fork_server`); the
server imports the rest (PRELOAD) and the launcher puts its socket in RLCORE_FORK_SERVER. A child
the launcher starts is then a client (fork_client.py, the standard library only) that sends the
server its command line, environment, folder, descriptors and process settings; the server forks,
the fork takes them on (its descriptors at the same numbers, its environment, thread count, CPU
affinity, limits, its title in `ps`) and runs the module as `python -m` would. Torchrun's ranks
come through the same door (`torchrun --no-python python -m rlcore.runtime.fork_client run ...`).

A fork enters its client's network, hostname, IPC and mount namespaces (namespaces.py: a client
under `ip netns exec`, as root); a client apart in another way starts fresh. A warm server
(warm_server.py) is the same server in a process of its own that outlives launches.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
from typing import Any

from . import fork_client, namespaces
from .child import quiet_datasets
from .fork_client import ENV
from .lifecycle import die_with_parent

PRELOAD = (
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.checkpoint",
    "torch.distributed.elastic.multiprocessing", "torch.distributed.launcher.api", "torch.distributed.run", "transformers",
    "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.modeling_utils", "grpc", "grpc_health.v1.health", "google.protobuf", "omegaconf",
    "rlcore.core.config",
)  # fmt: skip
"""What the server imports before it forks: what every child needs and takes seconds (never a module
a child runs as __main__, which runpy would warn is imported already)."""

SET_AFTER_FORK = frozenset({
    "OMP_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX", "PYTHONUNBUFFERED",
    "PYTHONFAULTHANDLER",
})  # fmt: skip
"""Start-up settings a fork takes on after the fork (torch's threads, mallopt, its stdio)."""

READ_AT_START = frozenset({
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONWARNINGS", "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDEVMODE", "PYTHONMALLOC",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
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


def host(path: str, parent: int, fd: int, preload: tuple[str, ...] = PRELOAD) -> None:
    """Serve forks on the listening socket `fd` (bound at `path`) until `parent` dies (or ends it).
    Imports `preload` first (what the process has imported already, it keeps)."""

    def end(signum: int, frame: Any) -> None:
        import shutil

        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    die_with_parent(signal.SIGTERM, parent)
    listener = socket.socket(fileno=fd)  # clients that come during the imports wait in its backlog
    own = dict(os.environ)
    import importlib

    for name in preload:
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
    gc.collect()
    gc.freeze()  # the imports' objects: a fork's collections skip them (and leave their pages shared)
    forks: dict[int, _Fork] = {}  # pidfd -> the fork
    by_conn: dict[int, _Fork] = {}  # client connection fd -> the fork
    while True:
        ready, _, _ = select.select([listener.fileno(), *forks, *by_conn], [], [], STOP_POLL_S if by_conn else None)
        for fork in by_conn.values():
            fork.mirror_stop()
        for fd in ready:
            if fd == listener.fileno():
                conn, _ = listener.accept()
                started = _fork_for(conn, own)
                if started is None:
                    conn.close()
                    continue
                fork = _Fork(*started, conn)
                forks[fork.pidfd] = by_conn[conn.fileno()] = fork
            elif fd in forks:
                fork = forks.pop(fd)
                by_conn.pop(fork.conn.fileno(), None)
                fork.reap()
            elif fd in by_conn:
                if not by_conn[fd].take_signal():
                    by_conn.pop(fd)


STOP_POLL_S = 0.25
"""How often the server looks whether a client was stopped (SIGSTOP, Ctrl-Z) or continued."""


class _Fork:
    """A fork and its client, in the server."""

    def __init__(self, pid: int, client: int, conn: socket.socket):
        self.pid, self.client, self.conn = pid, client, conn
        self.pidfd = os.pidfd_open(pid)
        self.stopped = False

    def reap(self) -> None:
        """The fork ended: tell the client how."""
        os.close(self.pidfd)
        _, status = os.waitpid(self.pid, 0)
        try:
            self.conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:
            pass
        self.conn.close()

    def take_signal(self) -> bool:
        """Pass the signal the client forwarded to the fork; False once the client is gone (the fork
        is then killed)."""
        try:
            data = self.conn.recv(64)
        except OSError:
            data = b""
        self._kill(int(data) if data else signal.SIGKILL)  # an empty read: the client is gone
        return bool(data)

    def mirror_stop(self) -> None:
        """Stop the fork while its client is stopped (SIGSTOP cannot be caught and forwarded)."""
        try:
            with open(f"/proc/{self.client}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            return
        stopped = state in (b"T", b"t")
        if stopped != self.stopped:
            self.stopped = stopped
            self._kill(signal.SIGSTOP if stopped else signal.SIGCONT)

    def _kill(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass


def _fork_for(conn: socket.socket, own: dict[str, str]) -> tuple[int, int] | None:
    """Fork for the request on `conn`; (the fork's pid, the client's), or None (refused: the client
    execs)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    client, uid, _ = struct.unpack("3i", creds)
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
        apart, join = namespaces.place(client)
        differs = _start_up_differs(request["env"], own) + apart
    except (ValueError, KeyError, TypeError):
        differs, join = ["(a request it cannot read)"], []
    if differs:
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"exec": f"{', '.join(differs)} differ(s) from the server's"}).encode())
        return None
    try:
        held = namespaces.open_namespaces(client, join)
    except OSError as e:  # the client is gone
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"exec": f"its namespaces cannot be opened ({e})"}).encode())
        return None
    pid = os.fork()
    if pid == 0:
        try:
            namespaces.enter(held)  # first: the client's folder and descriptors are where it lives
            _become(request, fds)
        except BaseException:  # noqa: BLE001 - a fork never returns into the server's loop
            import traceback

            traceback.print_exc()
            os._exit(70)
    for fd in [*fds, *(fd for fd, _ in held)]:
        os.close(fd)
    conn.send(b'{"started": true}')
    return pid, client


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the fork: take on the client's descriptors, environment and settings, run its module."""
    fork_client._STAND_IN = int(request.get("pid") or 0) or None
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
    _process_settings(request.get("process") or {})
    _settings(request["env"], request["unbuffered"])
    argv = request["argv"]
    _run_module(argv[0], argv[1:], request["title"])


def _process_settings(process: dict[str, Any]) -> None:
    """The client's CPU affinity, niceness, umask and resource limits (those a process may take)."""
    import resource

    if "affinity" in process:
        os.sched_setaffinity(0, process["affinity"])
    if "nice" in process:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, int(process["nice"]))
        except OSError:  # lowering niceness needs privileges the client had from elsewhere
            pass
    if "umask" in process:
        os.umask(int(process["umask"]))
    for name, (soft, hard) in (process.get("rlimits") or {}).items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError, AttributeError):
            pass


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
    quiet_datasets(env)
    if "OMP_NUM_THREADS" in env and "torch" in sys.modules:
        try:
            sys.modules["torch"].set_num_threads(max(1, int(env["OMP_NUM_THREADS"])))
        except ValueError:
            pass
    libc: Any = None
    for key, option in (("MALLOC_TRIM_THRESHOLD_", -1), ("MALLOC_MMAP_THRESHOLD_", -3), ("MALLOC_ARENA_MAX", -8)):
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
