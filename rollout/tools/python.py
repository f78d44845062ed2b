"""`python`: runs a snippet in a fresh interpreter inside the sandbox for model-written code
(rollout/sandbox.py: an allow-listed environment without the run's credentials, a folder of its own,
no network, limits on time, CPU, memory, output and processes), and returns what it printed
(stdout, then stderr)."""

from __future__ import annotations

import signal
import sys
from typing import Any

from ..sandbox import SandboxPolicy, run
from .base import Tool, ToolError

MAX_OUTPUT = 2000
"""Characters of output the model reads (the rest is cut, and said so)."""
RUN_STDIN = "import sys; exec(compile(sys.stdin.read(), '<code>', 'exec'), {'__name__': '__main__'})"
"""The program: the code comes on stdin (so tracebacks name its lines)."""
ARGS = ("timeout_s", "memory_mb", "cpu_s", "max_processes", "network", "env", "backend")


class PythonTool(Tool):
    """`tool_args.python`: `timeout_s` (default 5), `memory_mb` (256), `cpu_s` (the timeout, rounded
    up), `max_processes` (16), `network` (false), `env` (names of worker variables the code may see;
    none), `backend` (the sandbox's: auto, bwrap or own)."""

    name = "python"
    description = "Run Python code and return what it prints."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a Python program; print the result"}},
        "required": ["code"],
    }

    def __init__(self, args: dict[str, Any] | None = None):
        super().__init__(args)
        unknown = sorted(set(self.args) - set(ARGS))
        if unknown:
            raise ValueError(
                f"tool_args.python: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(ARGS)}"
            )
        timeout_s = float(self.args.get("timeout_s", 5.0))
        env = self.args.get("env", [])
        if not isinstance(env, list) or not all(isinstance(name, str) for name in env):
            raise ValueError(f"tool_args.python.env must be a list of variable names; got {env!r}")
        try:
            self.policy = SandboxPolicy(
                timeout_s=timeout_s, cpu_s=int(self.args.get("cpu_s", max(1, -int(-timeout_s // 1)))),
                memory_mb=int(self.args.get("memory_mb", 256)), max_processes=int(self.args.get("max_processes", 16)),
                network=bool(self.args.get("network", False)), env=tuple(env), output_bytes=64 * 1024,
                backend=str(self.args.get("backend", "auto")),
            )  # fmt: skip
        except ValueError as e:
            raise ValueError(f"tool_args.python: {e}") from None

    def __call__(self, arguments: dict[str, Any]) -> str:
        code = self.required_str(arguments, "code")
        result = run([sys.executable, "-I", "-c", RUN_STDIN], code, self.policy)
        if result.timed_out:
            raise ToolError(f"the code ran longer than {self.policy.timeout_s:g} s and was stopped")
        if result.returncode == -signal.SIGXCPU:
            raise ToolError(f"the code used more than {self.policy.cpu_s} s of CPU and was stopped")
        text = result.stdout + (result.stderr if result.returncode else "")
        if result.returncode and "MemoryError" in result.stderr:
            raise ToolError(f"the code ran out of memory (limit {self.policy.memory_mb} MB)")
        if result.returncode:
            raise ToolError(text.strip()[-MAX_OUTPUT:] or f"exited with status {result.returncode}")
        if len(text) > MAX_OUTPUT or result.output_cut:
            return text[:MAX_OUTPUT] + f"\n[output cut at {MAX_OUTPUT} characters]"
        return text
