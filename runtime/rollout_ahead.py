"""synchronizer.rollout_ahead: the next explore step's rollout, generated on the rollout workers
while this step trains.

The loop (runtime/loop.py) uses it:

    after the step's rollout   start(next explore step, rollout)   a thread: it only waits on gRPC
    train                      (the workers generate meanwhile)
    before sync/eval/save      wait()                              the engines are idle again
    the next step              take(explore step)                  its experiences, and the version
                                                                   they were started at
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class RolloutAhead:
    def __init__(self, enabled: bool):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlcore-rollout-ahead") if enabled else None
        self._pending: tuple[int, int, Future] | None = None
        """Explore step, the weights' version when it started, the rollout."""

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    def start(self, explore_step: int, rollout: Callable[[], Any], version: int = -1) -> None:
        assert self._pool is not None and self._pending is None, "one rollout ahead at a time"
        self._pending = (explore_step, version, self._pool.submit(rollout))

    def wait(self) -> dict[str, float]:
        """Wait for the rollout started ahead (its failure raises here, before anything else touches
        the engines); returns how long that took."""
        if self._pending is None:
            return {}
        start = time.perf_counter()
        self._pending[2].result()
        return {"perf/rollout_ahead_wait_s": time.perf_counter() - start}

    def take(self, explore_step: int) -> tuple[Any, int] | None:
        """The result of the rollout started for `explore_step` and the version it started at, or
        None when none was started."""
        if self._pending is None:
            return None
        step, version, rollout = self._pending
        self._pending = None
        assert step == explore_step, (step, explore_step)
        return rollout.result(), version

    def close(self) -> None:
        """Release the thread; a rollout still running (the step failed) is not waited for."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
