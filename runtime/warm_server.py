"""A warm fork server: the fork server (fork_server.py) in a process of its own that outlives
launches, with what launches, rollout workers and every strategy's ranks import already imported.
Where RLCORE_FORK_SERVER names one, `rlcore` hands its command over to a fork of it
(fork_client.hand_over), so a launch, `rlcore config validate` or a bench starts without importing
anything, and so do the processes it starts. The test suite runs on one (tests/conftest.py).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from typing import Any

from .child import thread_settings
from .fork_client import ENV, client_command
from .fork_server import PRELOAD, host

WARM_PRELOAD = PRELOAD + (
    "transformers.generation", "peft", "megatron.core", "megatron.core.models.gpt", "rlcore.cli.main",
    "rlcore.runtime.launcher", "rlcore.runtime.loop", "rlcore.runtime.handles", "rlcore.rollout.serve",
    "rlcore.backends.fsdp.strategy", "rlcore.backends.fsdp2.strategy", "rlcore.backends.megatron.strategy",
    "rlcore.runtime.rank_entry", "rlcore.runtime.trainer_world", "rlcore.runtime.run_service", "rlcore.core.monitor",
    "rlcore.weights.sender", "rlcore.rollout.engines.hf", "rlcore.rollout.engines.hf_attention",
    "datasets",  # tasksets: the launcher's prompt-length check and rank 0 load them (with pandas, 1-1.5 s)
    "scipy.io",  # and datasets' loaders import it when they first build (0.45 s of each process)
)  # fmt: skip
"""A warm server's imports: also what launches, rollout workers and each strategy's ranks import."""



class WarmServer:
    """A fork server in a process of its own that outlives launches (WARM_PRELOAD imported). With
    `export`, RLCORE_FORK_SERVER names it in this process's environment while the context lasts, so
    the `rlcore` commands this process starts, and their children, are forks of it; else its socket
    is `path`, for the environments of the processes that should use it. Its output goes to `log`
    (None: nowhere)."""

    def __init__(self, log: str | None = None, timeout_s: float = 60.0, export: bool = True):
        self.log, self.timeout_s, self.export = log, timeout_s, export
        self.env = {k: v for k, v in os.environ.items() if k != ENV}
        thread_settings(self.env)  # as `rlcore` sets them for itself (runtime/child.py)
        self.path = ""
        self._proc: Any = None
        self._dir = ""

    def __enter__(self) -> WarmServer:
        import subprocess
        import time

        self._dir = tempfile.mkdtemp(prefix="rlcore-fork-")  # 0700: only this user reaches the socket
        self.path = os.path.join(self._dir, "s")
        command = [sys.executable, "-m", "rlcore.runtime.warm_server", self.path, str(os.getpid())]
        with open(self.log or os.devnull, "ab") as out:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(self.path):  # bound before its imports: clients wait in its backlog
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the fork server did not start (exit {self._proc.poll()}); its log: {self.log}")
            time.sleep(0.02)
        if self.export:
            os.environ[ENV] = self.path
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Return once the server has made its imports (it answers a client only then)."""
        import subprocess

        command = client_command(None, "json.tool", "--help", server=self.path)
        subprocess.run(command, capture_output=True, check=True, timeout=timeout_s, env=self.env)

    def wait(self) -> int:
        """Until the server ends; its exit code."""
        return int(self._proc.wait())

    def __exit__(self, *exc: object) -> None:
        import shutil
        import subprocess

        if self.export:
            os.environ.pop(ENV, None)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # its forks get SIGTERM with it
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def serve(path: str, parent: int) -> None:
    """The warm server's process: listen at `path`, import WARM_PRELOAD, fork until `parent` ends."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    host(path, parent, listener.detach(), WARM_PRELOAD)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m rlcore.runtime.warm_server SOCKET PARENT_PID")
    serve(sys.argv[1], int(sys.argv[2]))


if __name__ == "__main__":
    main()
