"""The explorer of an asynchronous `both` stage: an ExploreLoop in a thread of the trainer's launch,
filling the in-memory buffer the trainer reads, restarted when it fails.

A failed loop (a rollout worker's error it could not retry, a bug in a workflow or a reward) is
replaced by a new one, explorer.max_restarts times at most, after 1, 2, 4, ... s, from the position
the failed one saved after its last step: the step it failed in is explored again from its tasks
(seeded: the same prompts), the tasks then still running (over-rollout) are sent again, and the
buffer already holds every group before. Past the limit the error waits for the trainer, which
raises it when it next takes experiences (buffer_source.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class ExplorerThread:
    """`build(start_step, resume_from)` makes an ExploreLoop (explore_loop.py) to run."""

    backoff_s = 1.0
    """The first restart's wait; each later one waits twice the one before."""

    def __init__(self, build: Callable[[int, dict[str, Any] | None], Any], start_step: int, max_restarts: int):
        self.build, self.start_step, self.max_restarts = build, start_step, max_restarts
        self.stop = threading.Event()
        self.error: BaseException | None = None
        """Set once it failed past explorer.max_restarts (the trainer raises it)."""
        self.restarts = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rlcore-explorer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the thread after its current step and wait for it."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        step, saved = self.start_step, None
        while True:
            loop = None
            try:
                loop = self.build(step, saved)
                loop.stop = self.stop  # close() stops whichever loop runs
                loop.run()
                return
            except BaseException as e:  # any failure of the loop: restarted, or reported
                if loop is not None:  # where it got to (a loop that failed to build kept the last one's)
                    step, saved = loop.explore_step, loop.saved or saved
                if self.stop.is_set():
                    return
                if self.restarts >= self.max_restarts:
                    log.error("the explorer stopped: %s (after %d restart(s), explorer.max_restarts)", e, self.restarts)
                    self.error = e
                    return
                self.restarts += 1
                delay = self.backoff_s * 2 ** (self.restarts - 1)
                log.warning(
                    "the explorer thread failed at explore step %d (%s: %s); restarting it in %g s "
                    "(%d of %d, explorer.max_restarts)", step, type(e).__name__, e, delay, self.restarts,
                    self.max_restarts,
                )  # fmt: skip
                if self.stop.wait(delay):
                    return
