"""Rollout workers fail over: with explorer.rollout_model.engine_num 2, a worker killed in the middle
of a run does not stop it. Its share of the batch goes to the other worker, the launch restarts it,
and the loop takes it back after syncing the current weights to it. The run trains every step.

The run is paused through RunService while the worker is killed and restarted, so the test does
not race the restart against the end of a short run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest
import yaml

from rlcore.client import ClientOptions, RunClient
from tests.integration.launch_utils import REPO, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

TOKEN = "failover-test-token"


def _rows(run_dir: str) -> list[dict]:
    try:
        return [m for m in read_metrics(run_dir) if "actor/loss" in m]
    except (FileNotFoundError, ValueError):
        return []


def _worker(root: str, index: int) -> psutil.Process:
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "serve" in cmd and root in " ".join(cmd) and cmd[cmd.index("--index") + 1] == str(index):
            return p
    raise AssertionError(f"no rollout worker {index}")


def _until(condition, what: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.skip(
    reason="flaky (2 of 4 runs): the run trains every step, but the restarted worker is not always taken "
    "back by the loop; under investigation (issue 23)"
)
def test_a_killed_rollout_worker_is_replaced_and_the_run_trains_every_step(tmp_path) -> None:
    # steps take ~0.1 s: enough of them that the pause lands before the end
    root, steps = str(tmp_path), 40
    cfg = tiny_grpo_config(
        root,
        **{"buffer.total_epochs": 3, "buffer.total_steps": steps, "explorer.rollout_model.engine_num": 2},
    )
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, env=dict(os.environ, RLCORE_TOKEN=TOKEN),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    run_dir = os.path.join(root, "it", "run")
    _until(lambda: len(_rows(run_dir)) >= 2, "two trained steps", proc)
    address = next(line.split(" on ")[1].strip() for line in out if "run controller (RunService) on" in line)
    with RunClient(address, ClientOptions(token=TOKEN, timeout=30)) as run:
        run.pause()
        # the pause takes effect at the end of the current step: wait until no step is logged for 3 s
        seen, quiet_since = len(_rows(run_dir)), time.monotonic()
        while time.monotonic() - quiet_since < 3.0:
            assert proc.poll() is None, "the run ended before the pause took effect"
            time.sleep(0.2)
            if len(_rows(run_dir)) != seen:
                seen, quiet_since = len(_rows(run_dir)), time.monotonic()
        killed = _worker(root, 1)
        killed_address = next(w.address for w in run.get_status().workers if w.worker_id == "rollout-1")
        killed.kill()

        def replaced() -> bool:
            workers = [w.address for w in run.get_status().workers if w.role == "rollout"]
            return len(workers) == 2 and killed_address not in workers

        _until(replaced, "the restarted worker to register", proc)
        run.resume()
    _, err = proc.communicate(timeout=300)
    reader.join(timeout=10)
    text = "".join(out)
    assert proc.returncode == 0, (text[-3000:], err[-3000:])
    assert [m["step"] for m in _rows(run_dir)] == list(range(1, steps + 1))
    assert "rlcore: rollout worker 1 exited" in text and "restarting it" in text, text[-3000:]
    # the loop dropped the dead worker, then took the restarted one back (after syncing it)
    sets = [
        line.split("rollout workers now: ")[1].split(" (were")[0]
        for line in out
        if "rollout workers now: " in line
    ]
    assert sets and len(sets[-1].split(", ")) == 2 and killed_address not in sets[-1], (sets, text[-6000:])
