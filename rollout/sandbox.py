"""Running model-written programs: the `python` tool's, and any that user tools, environments or
workflows start (`run(argv, stdin, SandboxPolicy(...))`, the one documented way to do it).

The program gets:
- an environment built from an allow-list (PATH, locale, a HOME and TMPDIR inside its folder, and the
  variables the policy names): never RLCORE_TOKEN, HF_TOKEN, WANDB_API_KEY or any other credential
  of the run, whatever the worker's environment holds;
- a fresh folder of its own, removed afterwards, the only place it may write, and read access to the
  interpreter's and the system's folders and a few files of /etc only (not the run folder, not
  $HOME, not /etc/shadow, not other processes' /proc);
- no network of any kind unless the policy allows it (namespaces of its own, and no socket() at all:
  TCP, UDP, DNS, unix sockets by path or abstract), no capabilities (as root too), no device nodes,
  no signals or ptrace to processes outside it;
- limits on wall time, CPU seconds, memory, bytes of output (stdout and stderr are files in its
  folder under RLIMIT_FSIZE) and processes.

Two backends give the same promise: `bwrap` (bubblewrap, where it is installed and works: a fresh
root with only the allowed folders in it, its own namespaces) with rlcore's own confinement inside
it, and `own` (rlcore's own: namespaces, capabilities, Landlock, seccomp; sandbox_exec.py) alone.
`auto` takes bwrap where it works. Each protection the machine cannot give is named once in a
warning (`isolation()` says what is enforced here); the program still runs.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field

from . import sandbox_bwrap
from .sandbox_bwrap import bwrap_path

log = logging.getLogger(__name__)

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_exec.py")
BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
"""Variables the program sees from the worker's environment (when set) without being named."""
BACKENDS = ("auto", "bwrap", "own")


@dataclass(frozen=True)
class SandboxPolicy:
    timeout_s: float = 5.0
    """Wall time before the program and everything it started are killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU)."""
    memory_mb: int = 256
    """Address space (RLIMIT_AS)."""
    output_bytes: int = 1 << 20
    """Bytes any one file it writes may hold, stdout and stderr included (RLIMIT_FSIZE)."""
    max_processes: int = 16
    """Processes and threads it may run at once."""
    network: bool = False
    """Whether it may open network connections (loopback included)."""
    env: tuple[str, ...] = field(default_factory=tuple)
    """Names of further variables of the worker's environment it may see."""
    backend: str = "auto"
    """`auto` (bubblewrap where it works, else rlcore's own), `bwrap` or `own`."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "output_bytes", "max_processes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive; got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    output_cut: bool = False
    """stdout or stderr reached output_bytes (the program was stopped there: SIGXFSZ)."""


@functools.cache
def isolation() -> dict[str, object]:
    """What this machine lets the sandbox enforce (probed once), the backend `auto` takes, and a
    warning for what it cannot enforce."""
    probe = subprocess.run(
        [sys.executable, "-I", LAUNCHER, "--probe"], capture_output=True, text=True, timeout=30
    )
    found: dict[str, object] = json.loads(probe.stdout) if probe.returncode == 0 else {}
    abi = int(found.get("landlock_abi", 0) or 0)  # type: ignore[call-overload]
    bwrap = bwrap_path()
    missing = []
    if not (found.get("landlock_abi") or bwrap):
        missing.append("file-system confinement (bubblewrap, or Landlock: Linux >= 5.13 with it enabled)")
    if not (found.get("netns") or found.get("seccomp") or bwrap):
        missing.append("network isolation (bubblewrap, namespaces, or seccomp on x86-64/arm64)")
    if abi < 6 and not bwrap:
        missing.append("signal confinement (bubblewrap, or Landlock ABI 6: Linux >= 6.12)")
    if found.get("root") and not found.get("pids_cgroup"):
        missing.append("a process limit (as root it needs a writable pids cgroup)")
    if missing:
        log.warning("sandbox for model-written code: this machine cannot enforce %s", "; ".join(missing))
    return {**found, "bwrap": bwrap, "backend": "bwrap" if bwrap else "own", "missing": missing}


def backend(policy: SandboxPolicy) -> str:
    """The backend `policy` runs with here: `bwrap` or `own`."""
    found = isolation()
    if policy.backend == "bwrap" and not found["bwrap"]:
        raise ValueError(
            "sandbox backend bwrap: `bwrap` is not installed or cannot make namespaces here; install "
            "bubblewrap (apt install bubblewrap) or use backend auto or own"
        )
    return str(found["backend"]) if policy.backend == "auto" else policy.backend


def read_dirs() -> list[str]:
    """Folders the program may read: the interpreter's, its standard library and site-packages, the
    system's. Not sys.path as a whole: it starts with the worker's working folder."""
    from .sandbox_exec import SYSTEM_DIRS

    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *sysconfig.get_paths().values(),
        *site.getsitepackages(),
    }
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(p for p in paths | set(SYSTEM_DIRS) if os.path.isdir(p))


def environment(folder: str, names: tuple[str, ...]) -> dict[str, str]:
    env = {name: os.environ[name] for name in (*BASE_ENV, *names) if name in os.environ}
    env.update(HOME=folder, TMPDIR=folder, PWD=folder, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    return env


def run(argv: list[str], stdin: str, policy: SandboxPolicy) -> SandboxResult:
    """Run `argv` (an absolute program path first) confined by `policy`, `stdin` as its input."""
    found, chosen = isolation(), backend(policy)
    with tempfile.TemporaryDirectory(prefix="rlcore-sandbox-") as folder:
        wrapper = None
        if chosen == "bwrap":
            wrapper = sandbox_bwrap.command(
                str(found["bwrap"]), folder, read_dirs(), LAUNCHER, policy.network
            )
        spec = {
            **asdict(policy), "file_bytes": policy.output_bytes, "read_dirs": read_dirs(),
            "landlock_abi": found.get("landlock_abi", 0), "netns": found.get("netns", False),
            "pids_cgroup": found.get("pids_cgroup"), "seccomp": found.get("seccomp", False), "wrapper": wrapper,
        }  # fmt: skip
        paths = {name: os.path.join(folder, f".{name}") for name in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w") as f:
            f.write(stdin)
        with (
            open(paths["stdin"]) as fin,
            open(paths["stdout"], "w") as fout,
            open(paths["stderr"], "w") as ferr,
        ):
            proc = subprocess.Popen(
                [sys.executable, "-I", LAUNCHER, json.dumps(spec), "--", *argv], cwd=folder, stdin=fin,
                stdout=fout, stderr=ferr, env=environment(folder, policy.env), start_new_session=True,
            )  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=policy.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # whatever it started goes too: its process group, and all in its pids cgroup
            _end(proc, found.get("pids_cgroup"))
        out, err = (_read(paths[name], policy.output_bytes) for name in ("stdout", "stderr"))
    returncode = proc.returncode
    if chosen == "bwrap" and 128 < returncode < 128 + signal.NSIG:
        returncode = 128 - returncode  # bwrap's init reports a program killed by signal N as 128 + N
    cut = returncode == -signal.SIGXFSZ or max(len(out), len(err)) >= policy.output_bytes
    return SandboxResult(returncode, out, err, timed_out=timed_out, output_cut=cut)


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _end(proc: subprocess.Popen, cgroup_root: object) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    if not isinstance(cgroup_root, str):
        return
    group = os.path.join(cgroup_root, f"rlcore-sandbox-{proc.pid}")
    for _ in range(50):
        try:
            with open(os.path.join(group, "cgroup.procs")) as f:
                for pid in f.read().split():
                    os.kill(int(pid), signal.SIGKILL)
            os.rmdir(group)
            return
        except FileNotFoundError:
            return  # never made: the launcher failed before
        except OSError:
            time.sleep(0.01)  # a killed process not reaped yet
    log.warning("sandbox: could not remove %s", group)
