"""`python`: runs a snippet in a fresh interpreter subprocess, with a wall-time and a memory limit,
and returns what it printed (stdout, then stderr)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from .base import Tool, ToolError

MAX_OUTPUT = 2000
"""Characters of output the model reads (the rest is cut, and said so)."""


class PythonTool(Tool):
    """`tool_args.python`: `timeout_s` (default 5), `memory_mb` (default 256)."""

    name = "python"
    description = "Run Python code and return what it prints."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a Python program; print the result"}},
        "required": ["code"],
    }

    def __init__(self, args: dict[str, Any] | None = None):
        super().__init__(args)
        self.timeout_s = float(self.args.get("timeout_s", 5.0))
        self.memory_mb = int(self.args.get("memory_mb", 256))
        if self.timeout_s <= 0 or self.memory_mb <= 0:
            raise ValueError(f"tool_args.python: timeout_s and memory_mb must be positive; got {self.args}")

    def __call__(self, arguments: dict[str, Any]) -> str:
        code = self.required_str(arguments, "code")
        limit = self.memory_mb * 1024 * 1024
        # The child caps its own address space before it compiles the code (read from stdin, so
        # tracebacks name its lines); its own session lets a timeout kill whatever it started.
        prelude = (
            f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
            "exec(compile(sys.stdin.read(), '<code>', 'exec'), {'__name__': '__main__'})"
        )
        with tempfile.TemporaryDirectory(prefix="rlcore-python-tool-") as cwd:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", prelude], cwd=cwd, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            )  # fmt: skip
            try:
                out, err = proc.communicate(code, timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise ToolError(f"the code ran longer than {self.timeout_s:g} s and was stopped") from None
        text = out + (err if proc.returncode else "")
        if proc.returncode and "MemoryError" in err:
            raise ToolError(f"the code ran out of memory (limit {self.memory_mb} MB)")
        if proc.returncode:
            raise ToolError(text.strip()[-MAX_OUTPUT:] or f"exited with status {proc.returncode}")
        return (
            text
            if len(text) <= MAX_OUTPUT
            else text[:MAX_OUTPUT] + f"\n[output cut at {MAX_OUTPUT} characters]"
        )
