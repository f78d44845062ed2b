"""The sandbox for model-written code, tried as a policy that learned to misbehave would
(tests/unit/rollout/sandbox_escapes.py): reach the worker over TCP, UDP, DNS or a unix socket, read
/etc/shadow or the worker's files, write outside its folder, make a device node, hold a capability,
read, signal or trace the worker, fork without end, take memory, CPU or time. Every attempt fails,
with either backend (bubblewrap; rlcore's own), run by root and by an unprivileged user. The
same program, unconfined, succeeds at each (so each check can fail)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from rlcore.rollout.sandbox import SandboxPolicy, isolation, run
from rlcore.rollout.tools.base import ToolError
from rlcore.rollout.tools.python import RUN_STDIN, PythonTool
from tests.unit.rollout.sandbox_escapes import PROGRAM, Listeners, as_nobody, try_escapes, try_limits

BACKENDS = ("own", "bwrap")


def needs(backend: str) -> None:
    if backend == "bwrap" and not isolation()["bwrap"]:
        if os.environ.get("RLCORE_REQUIRE_BWRAP") == "1":
            pytest.fail("RLCORE_REQUIRE_BWRAP=1 but bubblewrap is missing or cannot make namespaces here")
        pytest.skip("bubblewrap is not installed or cannot make namespaces here (apt install bubblewrap)")
    missing = isolation()["missing"]
    if missing:
        pytest.skip(f"this machine cannot enforce {missing}")


def needs_root_to_become_nobody() -> None:
    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")):
        pytest.skip("running as an unprivileged user needs root (to switch), setpriv and unshare")


def escaped(outcomes: dict[str, str]) -> dict[str, str]:
    return {name: outcome for name, outcome in outcomes.items() if not outcome.startswith("refused")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_escape_fails_as_the_workers_user(backend: str) -> None:
    needs(backend)
    outcomes = try_escapes(backend)
    assert len(outcomes) == 19 and not escaped(outcomes), escaped(outcomes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_escape_fails_as_an_unprivileged_user(backend: str) -> None:
    needs(backend)
    needs_root_to_become_nobody()
    outcomes = as_nobody(backend)
    assert len(outcomes) == 19 and not escaped(outcomes), escaped(outcomes)
    limits = as_nobody(backend, "limits")
    assert len(limits) == 4 and not escaped(limits), escaped(limits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processes_memory_cpu_and_wall_time_are_bounded(backend: str) -> None:
    needs(backend)
    outcomes = try_limits(backend)
    assert len(outcomes) == 4 and not escaped(outcomes), escaped(outcomes)
    result = run(
        [sys.executable, "-I", "-c", RUN_STDIN], "print('x' * 10**7)", SandboxPolicy(output_bytes=4096)
    )
    assert result.output_cut and len(result.stdout) == 4096


def test_the_same_program_unconfined_escapes_every_way(tmp_path) -> None:
    """The escapes' checks can fail: run as a plain child of the worker, each attempt succeeds
    (as root; an unprivileged user could not read /etc/shadow or make a device node anyway)."""
    if os.geteuid() != 0:
        pytest.skip("the unconfined run reads /etc/shadow and makes a device node: it needs root")
    listeners = Listeners(str(tmp_path))
    folder = tempfile.mkdtemp(dir=tmp_path)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", PROGRAM], input=json.dumps(listeners.probe()),
                              capture_output=True, text=True, timeout=60, cwd=folder)  # fmt: skip
        outcomes = json.loads(done.stdout)
        assert sorted(listeners.heard()) == ["abstract", "dns", "tcp", "udp", "unix"]
    finally:
        listeners.close()
        for leftover in ("/tmp/rlcore-sandbox-evil", os.path.join(sys.prefix, "rlcore-sandbox-evil")):
            if os.path.exists(leftover):
                os.remove(leftover)
    assert len(outcomes) == 17 and all(outcome.startswith("ESCAPED") for outcome in outcomes.values()), (
        outcomes
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_code_sees_no_credential_and_writes_its_own_folder(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs(backend)
    for name in ("RLCORE_TOKEN", "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_SETTING"):
        monkeypatch.setenv(name, f"secret-{name}")
    code = "import os; print(sorted(os.environ)); print(open('/proc/self/environ').read())\n"
    code += "open('mine.txt', 'w').write('ok'); print(open('mine.txt').read())"
    result = run([sys.executable, "-I", "-c", RUN_STDIN], code, SandboxPolicy(backend=backend))
    assert result.returncode == 0 and "secret-" not in result.stdout, result
    names = eval(result.stdout.splitlines()[0])  # noqa: S307 (our own program's print)
    assert set(names) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TMPDIR", "PWD", "PYTHONDONTWRITEBYTECODE",
                          "PYTHONHASHSEED"}  # fmt: skip
    assert result.stdout.endswith("ok\n")
    # a variable the tool's policy names does reach it
    result = run([sys.executable, "-I", "-c", RUN_STDIN], "import os; print(os.environ['MY_SETTING'])",
                 SandboxPolicy(backend=backend, env=("MY_SETTING",)))  # fmt: skip
    assert result.stdout == "secret-MY_SETTING\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_policy_with_network_reaches_the_workers_port(backend: str) -> None:
    needs(backend)
    with socket.create_server(("127.0.0.1", 0)) as server:
        code = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=5); print('ok')"
        result = run(
            [sys.executable, "-I", "-c", RUN_STDIN], code, SandboxPolicy(backend=backend, network=True)
        )
        assert result.stdout == "ok\n", result


def test_a_backend_that_is_not_there_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^backend must be one of auto, bwrap, own; got 'docker'$"):
        SandboxPolicy(backend="docker")


def test_the_python_tool_says_which_limit_stopped_the_code() -> None:
    tool = PythonTool({"timeout_s": 20, "cpu_s": 1, "memory_mb": 128})
    assert tool({"code": "print(sum(range(10)))"}) == "45\n"
    with pytest.raises(ToolError, match=r"^the code used more than 1 s of CPU and was stopped$"):
        tool({"code": "while True: pass"})
    with pytest.raises(ToolError, match="out of memory"):
        tool({"code": "x = bytearray(512 * 1024 * 1024)"})
    assert tool({"code": "print('y' * 5000)"}).endswith("[output cut at 2000 characters]")
    with pytest.raises(ValueError, match=r"^tool_args\.python: unknown key\(s\) memory; allowed: timeout_s"):
        PythonTool({"memory": 1})
