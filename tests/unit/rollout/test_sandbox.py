"""The sandbox for model-written code, tried as a policy that learned to misbehave would: read the
run's token, write outside its folder, connect to the worker's port, signal the worker, fork without
end, print without end. Each attempt fails. Protections this machine cannot give are skipped with the
reason (`isolation()` names them); CI's machines give them all."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from rlcore.rollout.sandbox import SandboxPolicy, isolation, run
from rlcore.rollout.tools.base import ToolError
from rlcore.rollout.tools.python import RUN_STDIN, PythonTool


def needs(what: str) -> None:
    missing = [m for m in isolation()["missing"] if what in m]  # type: ignore[union-attr]
    if missing:
        pytest.skip(f"this machine cannot enforce {missing[0]}")


def python(code: str, **policy: object) -> tuple[int, str, str]:
    result = run([sys.executable, "-I", "-c", RUN_STDIN], code, SandboxPolicy(**policy))  # type: ignore[arg-type]
    return result.returncode, result.stdout, result.stderr


def test_the_code_sees_no_credential_of_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RLCORE_TOKEN", "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_SETTING"):
        monkeypatch.setenv(name, f"secret-{name}")
    rc, out, _ = python("import os; print(sorted(os.environ)); print(open('/proc/self/environ').read())")
    assert rc == 0 and "secret-" not in out
    names = eval(out.splitlines()[0])  # noqa: S307 (our own program's print)
    assert set(names) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE",
                          "PYTHONHASHSEED"}  # fmt: skip
    # a variable the tool's policy names does reach it
    rc, out, _ = python("import os; print(os.environ['MY_SETTING'])", env=("MY_SETTING",))
    assert out == "secret-MY_SETTING\n"


def test_the_code_writes_in_its_own_folder_only(tmp_path) -> None:
    needs("file-system")
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / "token").write_text("secret")
    code = f"""
import os
open("mine.txt", "w").write("ok"); print("own folder:", open("mine.txt").read())
for path in [{str(run_folder / "evil.txt")!r}, "/tmp/rlcore-sandbox-evil.txt", os.path.expanduser("~root/evil")]:
    try:
        open(path, "w").write("x"); print("WROTE", path)
    except OSError as e:
        print("refused", type(e).__name__)
try:
    print("READ", open({str(run_folder / "token")!r}).read())
except OSError as e:
    print("refused", type(e).__name__)
"""
    rc, out, err = python(code)
    assert rc == 0, err
    assert out.startswith("own folder: ok\n") and "WROTE" not in out and "READ" not in out
    assert out.count("refused PermissionError") == 4
    assert not (run_folder / "evil.txt").exists() and not os.path.exists("/tmp/rlcore-sandbox-evil.txt")


def test_the_code_cannot_reach_the_workers_port_or_signal_it() -> None:
    needs("network")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"""
import os, socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2); print("CONNECTED")
except OSError as e:
    print("refused", e.errno)
"""
        rc, out, err = python(code)
        assert rc == 0 and out.startswith("refused"), (out, err)
        # the door's and gRPC's ports are open to everything that may use the network
        rc, out, _ = python(code, network=True)
        assert out == "CONNECTED\n"
    needs("signal")
    rc, out, _ = python("import os\ntry:\n os.kill(os.getppid(), 0); print('SIGNALLED')\nexcept OSError: print('refused')")
    assert out == "refused\n"


def test_processes_output_cpu_and_wall_time_are_bounded() -> None:
    needs("process limit")
    fork_bomb = "import os, time\nfor _ in range(64):\n    if os.fork() == 0:\n        time.sleep(5)\n        os._exit(0)"
    rc, out, err = python(fork_bomb, max_processes=8)
    assert rc != 0 and "BlockingIOError" in err
    result = run([sys.executable, "-I", "-c", RUN_STDIN], "print('x' * 10**7)", SandboxPolicy(output_bytes=4096))
    assert result.output_cut and len(result.stdout) == 4096
    result = run([sys.executable, "-I", "-c", RUN_STDIN], "while True: pass", SandboxPolicy(cpu_s=1, timeout_s=30))
    assert result.returncode < 0 and not result.timed_out  # SIGXCPU after 1 s of CPU
    result = run([sys.executable, "-I", "-c", RUN_STDIN], "import time; time.sleep(30)", SandboxPolicy(timeout_s=0.5))
    assert result.timed_out


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
