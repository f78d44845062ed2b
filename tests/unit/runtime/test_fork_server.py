"""The fork server (runtime/fork_server.py) on a real server process: a forked child runs its
module as `python -m` would (argv, folder, environment, descriptors, thread count), and its client
stands in for it (exit codes, signals both ways); where a fork would differ, the client starts
Python fresh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from rlcore.runtime import fork_client, fork_server, warm_server

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROBE = "tests.unit.runtime.fork_probe"


LAUNCHER = """
import os, sys
import torch
from rlcore.runtime.fork_server import ENV, ForkServer
with ForkServer(True) as fs:
    assert fs.enabled
    print(os.environ[ENV], flush=True)
    sys.stdin.read()
"""
"""A process that enters the fork server as `rlcore launch` does (after importing torch, before
anything runs) and holds it until its stdin closes (not this pytest process: its earlier tests
leave threads and descriptors a fork should not have)."""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if k != fork_server.ENV}  # not the suite's warm server
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    path = launcher.stdout.readline().strip()
    warm = os.environ.get(fork_server.ENV)
    os.environ[fork_server.ENV] = path  # what client_command names
    try:
        yield path
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=60)
        if warm:
            os.environ[fork_server.ENV] = warm
        else:
            os.environ.pop(fork_server.ENV, None)


def _run(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    cmd = fork_client.client_command(os.getpid(), PROBE, *args)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, **kw)


def _report(out: str) -> dict:
    return json.loads(out.splitlines()[0])


def test_a_fork_runs_the_module_with_the_clients_argv_folder_environment_and_threads(server: str) -> None:
    env = dict(os.environ, PROBE_MARKER="m1", OMP_NUM_THREADS="1")
    done = _run("exit", "3", env=env)
    report = _report(done.stdout)
    assert done.returncode == 3, done.stderr
    assert report["torch"] and report["argv"] == ["exit", "3"] and report["cwd"] == REPO  # forked: torch is in
    assert report["marker"] == "m1" and report["threads"] == 1
    assert report["fds"][:3] == [0, 1, 2]


def test_an_uncaught_exception_is_a_traceback_and_code_1(server: str) -> None:
    done = _run("raise")
    assert done.returncode == 1 and "RuntimeError: the probe failed" in done.stderr, done.stderr


def test_signals_reach_the_fork_and_its_end_reaches_the_client(server: str) -> None:
    cmd = fork_client.client_command(os.getpid(), PROBE, "wait")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    fork = _report(proc.stdout.readline())["pid"]
    proc.send_signal(signal.SIGTERM)  # to the client: forwarded
    assert proc.wait(timeout=30) == 7 and "got SIGTERM" in proc.stdout.read()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    fork = _report(proc.stdout.readline())["pid"]
    os.kill(fork, signal.SIGKILL)  # the fork killed: the client ends as it did
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    fork = _report(proc.stdout.readline())["pid"]
    proc.kill()  # the client killed: the server kills the fork
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(fork):
        assert time.monotonic() < deadline, "the fork outlived its killed client"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_passed_descriptors_keep_their_numbers(server: str) -> None:
    read, write = os.pipe()
    try:
        done = _run("fd", str(write), pass_fds=(write,))
        os.close(write)
        assert done.returncode == 0, done.stderr
        assert write in _report(done.stdout)["fds"]
        assert os.read(read, 100) == b"through the passed descriptor"
    finally:
        os.close(read)


def test_a_start_up_variable_that_differs_or_no_server_starts_python_fresh(server: str) -> None:
    env = dict(os.environ, PYTHONHASHSEED="123")  # read only at start-up: a fork would not have it
    done = _run("exit", "0", env=env)
    assert done.returncode == 0 and not _report(done.stdout)["torch"], done.stderr
    assert "PYTHONHASHSEED differ(s) from the server's" in done.stderr
    env = dict(os.environ, **{fork_server.ENV: "/nonexistent/s"})
    cmd = fork_client.client_command(os.getpid(), PROBE, "exit", "4")
    cmd[cmd.index(server)] = "/nonexistent/s"
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and not _report(done.stdout)["torch"], done.stderr


def test_the_server_is_off_when_not_wanted() -> None:
    class Cluster:
        fork_server, device = "auto", "cuda"

    assert not fork_server.wanted(Cluster())
    Cluster.device = "cpu"
    assert fork_server.wanted(Cluster())
    Cluster.fork_server = "off"
    assert not fork_server.wanted(Cluster())
    before = os.environ.get(fork_server.ENV)
    with fork_server.ForkServer(False) as fs:
        assert fs._pid is None and os.environ.get(fork_server.ENV) == before


def test_a_fork_takes_its_clients_affinity_niceness_and_limits(server: str) -> None:
    import resource

    def lower() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        os.nice(3)
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    done = _run("exit", "0", preexec_fn=lower)
    report = _report(done.stdout)
    assert report["torch"], done.stderr
    assert report["affinity"] == [min(os.sched_getaffinity(0))] and report["nice"] == os.nice(0) + 3
    assert report["nofile"] == 512


def test_a_stopped_client_stops_its_fork_until_it_continues(server: str) -> None:
    cmd = fork_client.client_command(os.getpid(), PROBE, "wait")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        fork = _report(proc.stdout.readline())["pid"]
        proc.send_signal(signal.SIGSTOP)  # cannot be caught and forwarded: the server mirrors it
        _wait_for_state(fork, "T")
        proc.send_signal(signal.SIGCONT)
        _wait_for_state(fork, "S")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_fork_whose_clients_parent_died_ends_though_it_ignores_the_signal(server: str) -> None:
    """A client that dies with whatever started it (a trainer rank's, under torchrun) passes its death
    signal on; a fork that ignores it (a rank > 0) ends once ORPHAN_GRACE_S has passed, as a fresh
    rank would have died with its parent."""
    starter = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(120)"
    cmd = fork_client.client_command(None, PROBE, "ignore")
    parent = subprocess.Popen([sys.executable, "-c", starter, *cmd], cwd=REPO, stdout=subprocess.PIPE, text=True)
    fork = _report(parent.stdout.readline())["pid"]
    parent.kill()
    parent.wait(timeout=30)
    ended = time.monotonic()
    time.sleep(2)
    assert _alive(fork)  # it ignored the SIGTERM passed on
    while _alive(fork):
        assert time.monotonic() - ended < fork_client.ORPHAN_GRACE_S + 10, "the fork outlived its client's grace"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{pid}/stat") as f:
            now = f.read().split(")")[-1].split()[0]
        if now == state:
            return
        assert time.monotonic() < deadline, f"process {pid} stayed {now}, not {state}"
        time.sleep(0.05)


def test_a_fork_enters_its_clients_network_namespace_and_a_client_in_another_pid_namespace_starts_fresh(
    server: str,
) -> None:
    """`unshare --net` (as `ip netns exec` does, with a mount namespace too): the fork lives in the
    client's network namespace; `unshare --pid --fork`: a fork cannot follow, the client runs itself."""
    if subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --net needs root and util-linux here")
    probe = fork_client.client_command(None, PROBE, "exit", "0")
    cmd = ["unshare", "--net", "--mount", *probe]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    report = _report(done.stdout)
    assert done.returncode == 0 and report["torch"], done.stderr  # forked
    assert report["net"] != os.stat("/proc/self/ns/net").st_ino, report  # the client's, not the server's
    cmd = ["unshare", "--pid", "--fork", *probe]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not _report(done.stdout)["torch"], done.stderr
    assert "its pid namespace differ(s) from the server's" in done.stderr


def test_a_command_hands_itself_over_to_a_warm_server() -> None:
    handing = "import sys; from rlcore.runtime.fork_client import hand_over; hand_over(sys.argv.pop(1))"
    warm = os.environ.pop(fork_server.ENV, None)
    try:
        with warm_server.WarmServer():
            cmd = [sys.executable, "-c", handing, PROBE, "exit", "5"]
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
            report = _report(done.stdout)
            assert done.returncode == 5 and report["torch"] and report["argv"] == ["exit", "5"], done.stderr
        assert fork_server.ENV not in os.environ
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)  # no server: itself
        assert done.returncode == 0 and "torch" not in done.stdout, done.stderr
    finally:
        if warm:
            os.environ[fork_server.ENV] = warm


def test_datasets_progress_bars_follow_the_variable_read_at_its_import_where_it_was_imported_before() -> None:
    """A fork of a warm server that imported datasets (before the launch set the variable) shows or
    hides its progress bars as a fresh import would (a launch's stderr is for what goes wrong)."""
    import datasets

    from rlcore.runtime.child import QUIET_DATASETS, quiet_datasets

    before = datasets.is_progress_bar_enabled()
    try:
        quiet_datasets({QUIET_DATASETS: "1"})
        assert not datasets.is_progress_bar_enabled()
        quiet_datasets({QUIET_DATASETS: "0"})
        assert datasets.is_progress_bar_enabled()
        quiet_datasets({})  # unset: as it was
        assert datasets.is_progress_bar_enabled()
    finally:
        (datasets.enable_progress_bars if before else datasets.disable_progress_bars)()
