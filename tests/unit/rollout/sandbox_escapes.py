"""Escapes from the sandbox for model-written code, tried as a policy that learned to misbehave would,
from inside it, against a worker that listens on every kind of socket and keeps a secret beside it.

    python -m tests.unit.rollout.sandbox_escapes BACKEND escapes|limits   # the outcomes as JSON

`try_escapes(backend)` returns {escape: outcome}; an outcome starts with "refused" when the attempt
failed and with "ESCAPED" when it worked. Run in-process by test_sandbox.py as the worker's user
(root here), and through `as_nobody` as an unprivileged user."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile

from rlcore.rollout.sandbox import SandboxPolicy, SandboxResult, run
from rlcore.rollout.tools.python import RUN_STDIN

PROGRAM = r"""
import ctypes, json, os, socket, sys
probe = json.loads(sys.argv[1] if len(sys.argv) > 1 else input())
out = {}

def attempt(name, action):
    try:
        out[name] = "ESCAPED: " + str(action())
    except Exception as e:  # every refusal the kernel or Python gives
        out[name] = f"refused: {type(e).__name__} {e}"

def tcp():
    socket.create_connection(("127.0.0.1", probe["tcp"]), timeout=2).close()
    return "connected"

def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(b"udp-escape", ("127.0.0.1", probe["udp"]))

def dns():  # a query for example.com, to the resolver the worker runs on loopback
    query = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(query, ("127.0.0.1", probe["dns"]))

def unix(address):
    def connect():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(address)
            s.sendall(b"unix-escape")
            return "connected"
    return connect

def write(path):
    def action():
        with open(path, "w") as f:
            f.write("x")
        return "wrote " + path
    return action

def mknod():
    os.mknod("null-device", 0o666 | 0o020000, os.makedev(1, 3))
    return "made a character device"

def capabilities():
    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}
    if int(caps["CapEff"], 16) or int(caps["CapPrm"], 16):
        return f"holds {caps}"
    raise PermissionError(f"no capabilities: {caps}")

def ptrace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(0x4206, probe["pid"], 0, 0) != 0:  # PTRACE_SEIZE: attaches without stopping it
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    libc.ptrace(17, probe["pid"], 0, 0)  # PTRACE_DETACH
    return "attached"

def raw_socket():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    return "opened"

attempt("tcp to the worker's port", tcp)
attempt("udp to the worker", udp)
attempt("dns query to a resolver", dns)
attempt("unix socket by path", unix(probe["unix_path"]))
attempt("abstract unix socket", unix("\0" + probe["unix_abstract"]))
attempt("raw packet socket", raw_socket)
attempt("read /etc/shadow", lambda: open("/etc/shadow").read()[:0] + "read")
attempt("read a file beside the worker", lambda: open(probe["secret"]).read())
attempt("list the worker's folder", lambda: os.listdir(os.path.dirname(probe["secret"])))
attempt("write beside the worker", write(os.path.join(os.path.dirname(probe["secret"]), "evil")))
attempt("write in /tmp", write("/tmp/rlcore-sandbox-evil"))
attempt("write under /usr", write(sys.prefix + "/rlcore-sandbox-evil"))
attempt("mknod a device", mknod)
attempt("hold a capability", capabilities)
attempt("read the worker's /proc", lambda: open(f"/proc/{probe['pid']}/environ").read()[:0] + "read")
attempt("signal the worker", lambda: os.kill(probe["pid"], 0) or "signalled")
attempt("ptrace the worker", ptrace)
print(json.dumps(out))
"""
"""The escapes, one program (the sandbox starts once); the probe (ports, paths, the worker's pid) on stdin."""


class Listeners:
    """The worker's side: a TCP port, a UDP port, a UDP "resolver", a unix socket by path and an
    abstract one, all non-blocking, and a secret file beside them; `heard()` says what reached any."""

    def __init__(self, folder: str):
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for s in (self.udp, self.dns):
            s.bind(("127.0.0.1", 0))
        self.unix_path = os.path.join(folder, "worker.sock")
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.abstract_name = f"rlcore-escape-{os.getpid()}"
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract.bind("\0" + self.abstract_name)
        for s in (self.tcp, self.unix, self.abstract):
            s.listen()
        self.secret = os.path.join(folder, "token")
        with open(self.secret, "w") as f:
            f.write("secret")
        os.chmod(self.secret, 0o644)
        self.sockets = (self.tcp, self.udp, self.dns, self.unix, self.abstract)
        for s in self.sockets:
            s.setblocking(False)

    def probe(self) -> dict[str, object]:
        return {
            "tcp": self.tcp.getsockname()[1], "udp": self.udp.getsockname()[1],
            "dns": self.dns.getsockname()[1], "unix_path": self.unix_path, "unix_abstract": self.abstract_name,
            "secret": self.secret, "pid": os.getpid(),
        }  # fmt: skip

    def heard(self) -> list[str]:
        heard = []
        for name, s in zip(("tcp", "udp", "dns", "unix", "abstract"), self.sockets, strict=True):
            try:
                s.accept()[0].close() if s.type == socket.SOCK_STREAM else s.recv(512)
                heard.append(name)
            except BlockingIOError:
                pass
        return heard

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def try_escapes(backend: str, network: bool = False) -> dict[str, str]:
    """Every escape of PROGRAM from a sandbox of `backend`; what reached the worker's sockets is
    outcome "heard by the worker"."""
    with tempfile.TemporaryDirectory(prefix="rlcore-worker-") as folder:
        os.chmod(folder, 0o755)
        listeners = Listeners(folder)
        try:
            program = RUN_STDIN.replace("sys.stdin.read()", repr(PROGRAM))
            argv = [sys.executable, "-I", "-c", program]
            result = run(argv, json.dumps(listeners.probe()), SandboxPolicy(backend=backend, network=network))
            assert result.returncode == 0 and result.stdout, (result.returncode, result.stdout, result.stderr)
            outcomes: dict[str, str] = json.loads(result.stdout)
            outcomes["heard by the worker"] = ", ".join(listeners.heard()) or "refused: nothing"
            outcomes["left a file in /tmp"] = (
                "ESCAPED" if os.path.exists("/tmp/rlcore-sandbox-evil") else "refused: no file"
            )
            return outcomes
        finally:
            listeners.close()


def try_limits(backend: str) -> dict[str, str]:
    """A fork bomb, a memory hog, a busy loop and a sleeper, each bounded by a small policy."""

    def python(code: str, **policy: object) -> SandboxResult:
        return run([sys.executable, "-I", "-c", RUN_STDIN], code, SandboxPolicy(backend=backend, **policy))  # type: ignore[arg-type]

    fork_bomb = "import os, time\nfor _ in range(64):\n    if os.fork() == 0:\n        time.sleep(5)\n        os._exit(0)"
    outcomes = {}
    result = python(fork_bomb, max_processes=8)
    outcomes["fork bomb"] = (
        "refused" if result.returncode and "BlockingIOError" in result.stderr else f"ESCAPED: {result}"
    )
    result = python("x = bytearray(1024 * 1024 * 1024); print(len(x))", memory_mb=128)
    outcomes["1 GiB in 128 MB"] = "refused" if "MemoryError" in result.stderr else f"ESCAPED: {result}"
    result = python("while True: pass", cpu_s=1, timeout_s=30)
    outcomes["busy past cpu_s"] = (
        "refused" if result.returncode < 0 and not result.timed_out else f"ESCAPED: {result}"
    )
    result = python("import time; time.sleep(30)", timeout_s=0.5)
    outcomes["sleep past timeout_s"] = "refused" if result.timed_out else f"ESCAPED: {result}"
    return outcomes


def as_nobody(backend: str, what: str = "escapes") -> dict[str, str]:
    """`try_escapes(backend)` (or `try_limits`) run by uid/gid 65534 (nobody), worker and sandbox alike. The
    interpreter may live under a folder nobody cannot enter (pyenv under /root): a mount namespace
    of the test's own then lays a world-readable tmpfs over that folder with the interpreter's tree
    bound back into it; nothing outside the test's process changes."""
    prefix = os.path.realpath(sys.base_prefix)
    closed = _closed_ancestor(prefix)
    steps = []
    if closed is not None:
        inner = os.sep.join(prefix.split(os.sep)[: len(closed.split(os.sep)) + 1])
        keep = tempfile.mkdtemp(prefix="rlcore-keep-")
        steps += [f"mount --bind {shlex.quote(inner)} {keep}", f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(closed)}",
                  f"mkdir {shlex.quote(inner)}", f"mount --move {keep} {shlex.quote(inner)}"]  # fmt: skip
    python = shlex.join(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                         "tests.unit.rollout.sandbox_escapes", backend, what])  # fmt: skip
    script = " && ".join([*steps, python])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _closed_ancestor(path: str) -> str | None:
    """The first folder above `path` that others may not enter (mode without o+x), if any."""
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        folder = os.sep.join(parts[:i])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


if __name__ == "__main__":
    print(json.dumps((try_escapes if sys.argv[2] == "escapes" else try_limits)(sys.argv[1])))
