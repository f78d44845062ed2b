"""The explorer thread of asynchronous `both` (runtime/explorer_thread.py): a failed loop is replaced
by one that starts where it saved, explorer.max_restarts times with a doubling wait, then the error
is the trainer's; a stop ends it, also while it waits to restart."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rlcore.runtime.explorer_thread import ExplorerThread


class FakeLoop:
    """An ExploreLoop's surface: runs `steps` steps from `start`, failing after `fail_after` of them."""

    def __init__(self, start: int, saved: dict | None, fail_after: int | None, steps: int = 5):
        self.explore_step, self.saved, self.fail_after, self.steps = start, None, fail_after, steps
        self.resumed_from = saved
        self.stop = threading.Event()

    def run(self) -> None:
        done = 0
        while self.explore_step < self.steps and not self.stop.is_set():
            if self.fail_after is not None and done == self.fail_after:
                raise ValueError(f"injected at step {self.explore_step}")
            self.explore_step += 1
            self.saved = {"explore_step": self.explore_step}
            done += 1


def _thread(failures: list[int | None], max_restarts: int, monkeypatch) -> tuple[ExplorerThread, list[FakeLoop]]:
    monkeypatch.setattr(ExplorerThread, "backoff_s", 0.01)
    loops: list[FakeLoop] = []

    def build(step: int, saved: dict[str, Any] | None) -> FakeLoop:
        loops.append(FakeLoop(step, saved, failures[len(loops)] if len(loops) < len(failures) else None))
        return loops[-1]

    return ExplorerThread(build, 0, max_restarts), loops


def test_a_failed_loop_is_replaced_by_one_that_starts_where_it_saved(monkeypatch, caplog) -> None:
    thread, loops = _thread([2, 0, None], max_restarts=3, monkeypatch=monkeypatch)
    thread.start()
    assert thread._thread is not None
    thread._thread.join(5)  # the last loop ran to its end
    assert thread.error is None and thread.restarts == 2
    assert [(loop.resumed_from, loop.explore_step) for loop in loops] == [
        (None, 2), ({"explore_step": 2}, 2), ({"explore_step": 2}, 5),  # the second failed before a step
    ]
    assert "the explorer thread failed at explore step 2 (ValueError: injected at step 2); restarting it in 0.01 s (1 of 3" in caplog.text
    assert "restarting it in 0.02 s (2 of 3, explorer.max_restarts)" in caplog.text


def test_past_max_restarts_the_error_is_the_trainers(monkeypatch) -> None:
    thread, loops = _thread([0, 0, 0, 0], max_restarts=2, monkeypatch=monkeypatch)
    thread.start()
    deadline = time.monotonic() + 5
    while thread.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(thread.error, ValueError) and thread.restarts == 2 and len(loops) == 3


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_stop_ends_it_while_it_waits_to_restart(monkeypatch, max_restarts: int) -> None:
    thread, loops = _thread([0, 0], max_restarts=max_restarts, monkeypatch=monkeypatch)
    monkeypatch.setattr(ExplorerThread, "backoff_s", 60.0)
    thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    thread.close(5)
    assert time.monotonic() - start < 2 and len(loops) == 1
    assert (thread.error is not None) == (max_restarts == 0)
