"""Rollout workers fail over: with explorer.rollout_model.engine_num 2, a worker killed in the middle
of a run does not stop it. Its share of the batch goes to the other worker, the launch restarts it,
and the loop takes it back after syncing the current weights to it. The run trains every step.
A worker that hangs (SIGSTOP: alive, silent) is left out once its call's deadline passes, and so
is a dead worker the config lists in explorer.rollout_model.endpoints (the launch did not start it,
so it does not restart it).

The run is paused through RunService while the worker is killed and restarted, so the test does
not race the restart against the end of a short run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import yaml

from rlcore.client import ClientOptions, RunClient
from tests.integration.launch_utils import REPO, read_metrics, tiny_grpo_config, wait_for_port_file

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


def _read(proc: subprocess.Popen) -> tuple[tuple[list[str], list[str]], list[threading.Thread]]:
    """The launch's stdout and stderr lines as they come (one reader each: a pipe read by two
    readers loses lines to the other)."""
    out: tuple[list[str], list[str]] = ([], [])
    readers = [
        threading.Thread(target=lambda lines=lines, pipe=pipe: lines.extend(pipe), daemon=True)
        for lines, pipe in zip(out, (proc.stdout, proc.stderr), strict=True)
    ]
    for r in readers:
        r.start()
    return out, readers


def _launch(
    root: str, cfg: dict, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, tuple[list[str], list[str]], list[threading.Thread]]:
    """`rlcore launch` of `cfg` (written to root/cfg.yaml), its output read as it comes."""
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return (proc, *_read(proc))


def _trained_every_step(
    proc: subprocess.Popen,
    readers: list[threading.Thread],
    out: list[str],
    errs: list[str],
    run_dir: str,
    steps: int,
) -> str:
    """The ended launch's stdout, once it is seen to exit 0 with every step trained."""
    for r in readers:
        r.join(timeout=10)
    text, err = "".join(out), "".join(errs)
    assert proc.returncode == 0, (text[-3000:], err[-3000:])
    assert [m["step"] for m in _rows(run_dir)] == list(range(1, steps + 1))
    return text


def _until(condition, what: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_killed_rollout_worker_is_replaced_and_the_run_trains_every_step(tmp_path) -> None:
    # steps take ~0.1 s: enough of them that the pause lands before the end
    root, steps = str(tmp_path), 40
    cfg = tiny_grpo_config(
        root,
        **{"buffer.total_epochs": 3, "buffer.total_steps": steps, "explorer.rollout_model.engine_num": 2},
    )
    proc, (out, errs), readers = _launch(root, cfg, dict(os.environ, RLCORE_TOKEN=TOKEN))
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
    proc.wait(timeout=300)
    text = _trained_every_step(proc, readers, out, errs, run_dir, steps)
    assert "rlcore: rollout worker 1 exited" in text and "restarting it" in text, text[-3000:]
    # the loop dropped the dead worker, then took the restarted one back (after syncing it)
    sets = _worker_sets(out)
    assert sets and len(sets[-1].split(", ")) == 2 and killed_address not in sets[-1], (sets, text[-6000:])


def test_the_only_rollout_worker_killed_is_waited_for_and_the_run_trains_every_step(tmp_path) -> None:
    """engine_num 1 and its worker killed with -9: the next step finds no worker at all, waits for
    the launch's restart (it once ended in a ZeroDivisionError splitting the batch over no worker),
    syncs the restarted one and goes on."""
    root, steps = str(tmp_path), 30
    cfg = tiny_grpo_config(root, **{"buffer.total_epochs": 3, "buffer.total_steps": steps})
    proc, (out, errs), readers = _launch(root, cfg, dict(os.environ, RLCORE_TOKEN=TOKEN))
    run_dir = os.path.join(root, "it", "run")
    _until(lambda: len(_rows(run_dir)) >= 2, "two trained steps", proc)
    address = next(line.split(" on ")[1].strip() for line in out if "run controller (RunService) on" in line)
    with RunClient(address, ClientOptions(token=TOKEN, timeout=30)) as run:
        run.pause()
        seen, quiet_since = len(_rows(run_dir)), time.monotonic()
        while time.monotonic() - quiet_since < 3.0:
            assert proc.poll() is None, "the run ended before the pause took effect"
            time.sleep(0.2)
            if len(_rows(run_dir)) != seen:
                seen, quiet_since = len(_rows(run_dir)), time.monotonic()
        _worker(root, 0).kill()
        run.resume()  # at once: the restart is not there yet
    proc.wait(timeout=300)
    text = _trained_every_step(proc, readers, out, errs, run_dir, steps)
    assert "rlcore: rollout worker 0 exited" in text and "restarting it" in text, text[-3000:]
    assert len(_worker_sets(out)) >= 1, text[-6000:]  # the loop took the restarted worker


def _worker_sets(out: list[str]) -> list[str]:
    return [
        line.split("rollout workers now: ")[1].split(" (were")[0]
        for line in out
        if "rollout workers now: " in line
    ]


def test_a_hung_rollout_worker_is_left_out_once_its_deadline_passes(tmp_path) -> None:
    root, steps = str(tmp_path), 12
    cfg = tiny_grpo_config(
        root,
        **{
            "buffer.total_epochs": 3, "buffer.total_steps": steps, "explorer.rollout_model.engine_num": 2,
            "explorer.max_timeout": 8, "synchronizer.sync_timeout": 8,
        },
    )  # fmt: skip
    proc, (out, errs), readers = _launch(root, cfg)
    run_dir = os.path.join(root, "it", "run")
    _until(lambda: len(_rows(run_dir)) >= 2, "two trained steps", proc)
    hung = _worker(root, 1)
    hung.send_signal(signal.SIGSTOP)
    try:
        proc.wait(timeout=300)
    finally:
        if hung.is_running():
            hung.kill()
    text = _trained_every_step(proc, readers, out, errs, run_dir, steps)
    sets = _worker_sets(out)
    assert sets and len(sets[-1].split(", ")) == 1, (sets, text[-6000:])


def test_a_dead_configured_worker_is_left_out(tmp_path, tiny_model_path) -> None:
    root, steps = str(tmp_path), 12
    procs, addresses = [], []
    env = dict(os.environ, RLCORE_TOKEN=TOKEN)
    try:
        for i in range(2):
            port_file = os.path.join(root, f"worker{i}.address")
            serve = ["rollout", "serve", "--model", tiny_model_path, "--port", "0", "--port-file", port_file,
                     "--threads", "1", "--max-model-len", "256", "--seed", str(i)]  # fmt: skip
            out_to = subprocess.DEVNULL
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "rlcore.cli", *serve],
                    cwd=REPO,
                    env=env,
                    stdout=out_to,
                    stderr=out_to,
                )
            )
            addresses.append(wait_for_port_file(port_file, procs[-1], f"rollout worker {i}"))
        cfg = tiny_grpo_config(
            root,
            **{
                "buffer.total_epochs": 3,
                "buffer.total_steps": steps,
                "explorer.rollout_model.endpoints": addresses,
            },
        )
        cfg["model"] = {"model_path": tiny_model_path, "max_model_len": 48, "max_prompt_tokens": 16,
                        "max_response_tokens": 8}  # fmt: skip
        proc, (out, errs), readers = _launch(root, cfg, env)
        run_dir = os.path.join(root, "it", "run")
        _until(lambda: len(_rows(run_dir)) >= 2, "two trained steps", proc)
        procs[1].kill()
        proc.wait(timeout=300)
        text = _trained_every_step(proc, readers, out, errs, run_dir, steps)
        assert _worker_sets(out)[-1] == addresses[0], (_worker_sets(out), text[-6000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
