"""`rlcore tinker serve` as the Tinker tests start it: its keys, its served model's name, the
server process (test_tinker_server.py, test_tinker_launch.py; the module-scoped `tinker_server` in
conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from .launch_utils import REPO, wait_for_port_file

KEY = "tml-rlcore-test"
OTHER = "tml-rlcore-other"
"""A second key the server takes: another tenant."""
MODEL = "rlcore/tiny"


def serve(root, model_path: str, port: int = 0) -> tuple[subprocess.Popen, str]:
    """`rlcore tinker serve` of `model_path` with its state in `root`/work: the process and its URL."""
    port_file, log = os.path.join(root, "port"), os.path.join(root, "server.log")
    if os.path.exists(port_file):
        os.remove(port_file)
    cmd = [sys.executable, "-m", "rlcore.cli", "tinker", "serve", "--base-model", f"{MODEL}={model_path}",
           "--port", str(port), "--port-file", port_file, "--workdir", os.path.join(root, "work"),
           "--max-model-len", "256", "--threads", "1", "--max-models", "32", "--max-model-mb", "64"]  # fmt: skip
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "TINKER_API_KEY": f"{KEY},{OTHER}", "TINKER_TELEMETRY": "0"},
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    return proc, "http://" + wait_for_port_file(port_file, proc, "tinker serve", log_file=log)
