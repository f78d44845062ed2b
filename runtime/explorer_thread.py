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
    """`build(start_step, resume_from)` makes an ExploreLoop (explore_loop.py) to run, sharing
    `lock` (held while a step's groups go into the buffer with the position after them)."""

    backoff_s = 1.0
    """The first restart's wait; each later one waits twice the one before."""

    def __init__(
        self, build: Callable[[int, dict[str, Any] | None], Any], start_step: int, max_restarts: int,
        resume_from: dict[str, Any] | None = None, await_workers: Callable[[Any], bool] | None = None,
    ):  # fmt: skip
        """`resume_from`: the position a checkpoint kept (`position()` then); `await_workers(loop)`:
        every rollout worker of the failed `loop` stopped answering: waits for the launch to restart
        one, True once it did (the loop is then built again at once, no restart counted)."""
        self.await_workers = await_workers
        self.build, self.start_step, self.max_restarts = build, start_step, max_restarts
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        """Set once it failed past explorer.max_restarts (the trainer raises it)."""
        self.restarts = 0
        self._thread: threading.Thread | None = None
        self._saved = resume_from
        self._loop: Any = None

    def position(self) -> dict[str, Any]:
        """Where the explorer stands after the last step it put into the buffer: the next explore
        step and the tasks then still running (call it holding `lock`)."""
        loop = self._loop
        saved = loop.saved if loop is not None and loop.saved is not None else self._saved
        return dict(saved) if saved is not None else {"explore_step": self.start_step}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rlcore-explorer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the thread after its current step and wait for it."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        step, saved = self.start_step, self._saved
        while True:
            loop = None
            try:
                loop = self.build(step, saved)
                loop.stop = self.stop  # close() stops whichever loop runs
                self._loop = loop
                loop.run()
                return
            except BaseException as e:  # any failure of the loop: restarted, or reported
                if loop is not None:  # where it got to (a loop that failed to build kept the last one's)
                    step, saved = loop.explore_step, loop.saved or saved
                    with self.lock:
                        self._saved, self._loop = saved, None
                if self.stop.is_set():
                    return
                if loop is not None and self.await_workers is not None and not loop.workers.clients:
                    if self.await_workers(loop):  # its workers died: the launch restarted one
                        continue
                if self.restarts >= self.max_restarts:
                    log.error(
                        "the explorer stopped: %s (after %d restart(s), explorer.max_restarts)",
                        e,
                        self.restarts,
                    )
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
