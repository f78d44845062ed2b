"""A run's processes end with it: kill -9, SIGTERM or SIGINT to `rlcore launch` at a random point of
training leaves no process of the run alive within 30 s (the launcher's children die with it, and
the trainer ranks with torchrun); SIGTERM and SIGINT first stop the run after its current step with
a checkpoint. One run, one owner: a second launch on a live run folder is refused in one line, and
the lock of a dead owner is taken over."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from tests.integration.launch_utils import REPO, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _start(root: str, *overrides: str) -> subprocess.Popen:
    # long enough to be stopped in the middle (16 steps an epoch)
    cfg = tiny_grpo_config(
        root, **{"buffer.total_epochs": 50, "buffer.total_steps": 500, "trainer.save_interval": 2}
    )
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path, *overrides],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _steps_logged(root: str) -> int:
    try:
        with open(os.path.join(root, "it", "run", "metrics.jsonl")) as f:
            return sum(1 for line in f if '"actor/pg_loss"' in line)
    except FileNotFoundError:
        return 0


def _wait_for_training(root: str, proc: subprocess.Popen, steps: int = 1, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while _steps_logged(root) < steps:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)


def _run_processes(root: str) -> list[psutil.Process]:
    """Every live process whose command line names this test's folder: launcher, workers, torchrun, ranks."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(
                root in arg for arg in p.info["cmdline"] or ()
            ):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _none_left(root: str, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while (left := _run_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:  # do not leave them to the next test
        p.kill()
    assert not left, [" ".join(p.cmdline()[:6]) for p in left]


def test_kill_9_of_the_launcher_leaves_no_process_of_the_run(tmp_path) -> None:
    root = str(tmp_path)
    proc = _start(root)
    _wait_for_training(root, proc)
    time.sleep(random.uniform(0, 2))
    assert len(_run_processes(root)) >= 4  # launcher, worker, torchrun, rank
    proc.kill()
    proc.wait()
    _none_left(root)

    # the dead owner's lock is taken over, with a warning naming it
    again = _start(root, "continue_from_checkpoint=true", "buffer.total_steps=2")
    _, err = again.communicate(timeout=240)
    assert again.returncode == 0, err
    assert f"took over the run folder from rlcore launch pid {proc.pid}" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_stops_the_run_after_a_checkpoint(tmp_path, sig) -> None:
    root = str(tmp_path)
    proc = _start(root)
    _wait_for_training(root, proc)
    time.sleep(random.uniform(0, 2))
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (out, err)
    summary_line = next(line for line in out.splitlines() if line.startswith("rlcore: stopped at step"))
    step = int(summary_line.split()[4])
    assert 1 <= step < 500
    run_dir = os.path.join(root, "it", "run")
    with open(os.path.join(run_dir, "latest")) as f:
        assert f.read().strip() == f"global_step_{step}"
    with open(os.path.join(run_dir, "stage_summary.json")) as f:
        assert json.load(f)["stopped"] is True
    _none_left(root)


def test_a_second_launch_on_a_live_run_is_refused_in_one_line(tmp_path) -> None:
    root = str(tmp_path)
    first = _start(root)
    try:
        _wait_for_training(root, first)
        second = _start(root, "continue_from_checkpoint=true")
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2, (out, err)
        assert err.strip().count("\n") == 0, err
        assert f"belongs to a live run (rlcore launch pid {first.pid} on host" in err
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()
    _none_left(root)


def test_a_launch_that_fails_its_checks_ends_the_world_it_started(tmp_path) -> None:
    """The trainer world starts while the launch prepares the run (its ranks import meanwhile); a
    check that fails then (here a prompt longer than model.max_prompt_tokens, found once the
    taskset is generated) is one line, and the world's torchrun and ranks end with the launch."""
    root = str(tmp_path)
    proc = _start(root, "model.max_prompt_tokens=3", "model.enable_prompt_truncation=false")
    seen: set[str] = set()
    while proc.poll() is None:  # the world was started before the check failed
        seen.update(" ".join(p.info["cmdline"] or ()) for p in _run_processes(root))
        time.sleep(0.1)
    out, err = proc.communicate()
    assert proc.returncode == 2, (out, err)
    assert err.strip().count("\n") == 0 and "more than model.max_prompt_tokens (3)" in err, err
    assert any("rlcore.runtime.torchrun" in c for c in seen), seen
    _none_left(root)

