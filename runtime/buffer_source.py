"""A trainer's experiences from an experience buffer (plan.reads_buffer): the buffer an explore launch
writes (plan.source buffer, a decoupled run's mode-train launch), or the in-memory one this stage's
own explorer thread fills (plan.source explorer_thread, asynchronous both).

A step takes buffer.batch_size groups at the step's position (explore_step, which checkpoints keep:
a resumed trainer gets the same groups for the steps it retrains), each experience tagged by its
explorer with the version of the weights that generated it. The places an explorer puts for the
tasks its difficulty filter skipped (refill false: core/types.skipped_task) count toward the batch
and are dropped: the step trains on one explore step's open tasks.

The in-memory buffer of an asynchronous run ends with its process, so each checkpoint keeps
`state_dict()` beside it: the groups not taken yet and the explorer's position after the last step
it put (taken together, under the explorer's lock). A resumed run puts those groups back and
explores on from that position: every group is trained once, none lost, across a stop or a kill.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..core.config import Stage
from ..core.types import Experience, is_skipped
from ..weights.schedule import SyncSchedule
from .paths import EXPLORER_DIR, published_dir

log = logging.getLogger("rlcore.loop")


class StopWhileWaiting(Exception):
    """The run asked to stop while the trainer waited for an explorer's experiences."""


class BufferSource:
    def __init__(
        self, stage: Stage, sdir: str, run_dir: str, heartbeat: Callable[[], str],
        while_waiting: Callable[[], None] | None = None,
    ):  # fmt: skip
        """Open the stage's buffer. `heartbeat()` reports to the run's controller without waiting and
        returns 'stop' when the run asks to stop (asked while waiting for an explore launch);
        `while_waiting()` runs between the polls of a wait for an explore launch's experiences."""
        cfg = self.cfg = stage.config
        self.stage, self.sdir, self.heartbeat, self.while_waiting = stage, sdir, heartbeat, while_waiting
        self.explorer_thread: Any = None  # explorer_thread: its ExplorerThread, started by `start_explorer`
        self.resume_from: dict[str, Any] | None = None
        """explorer_thread: the explorer's position a checkpoint kept (`load_state_dict`)."""
        self.explore_launch: Any = None  # buffer: the explore launch, watched through its lock
        eb = cfg.buffer.trainer_input.experience_buffer
        self.buffer: Any
        if stage.plan.source == "explorer_thread":
            from ..buffer import memory_buffer

            self.buffer = memory_buffer(eb)
        else:
            from ..buffer import open_buffer
            from .run_lock import PeerLaunch

            self.buffer = open_buffer(cfg, wait_s=30.0)
            self.explore_launch = PeerLaunch(os.path.join(run_dir, EXPLORER_DIR), "explore launch")
            log.info("reading experiences from %s", self.buffer.describe())
        self.keys: set[tuple] | None = set() if eb.replay_buffer.enable else None
        """With the replay buffer: the groups trained on so far (to count the reused ones)."""
        self.exhausted = False
        """Every explorer finished and the buffer is read."""
        self.next_step = 0
        """The position the next take asks for, as the buffer's ledger counts them (a checkpoint keeps
        it): the one after the last take's, but a take that found the buffer read to its end is one
        step in some stores and none in others."""

    def start_explorer(
        self, endpoints: list[str], start_step: int, registered: Callable[[], list[str] | None] | None = None,
    ) -> None:  # fmt: skip
        """plan.source explorer_thread: explore from `start_step` (or the position a checkpoint kept)
        on the workers at `endpoints`; `registered()`: the launch's workers as the run lists them now
        (restarted ones come back at new addresses), None where it does not manage them."""
        from .explore_loop import ExploreLoop
        from .explorer_thread import ExplorerThread

        def build(step: int, resume_from: dict[str, Any] | None) -> ExploreLoop:
            return ExploreLoop(
                self.stage, os.path.join(self.sdir, "explorer"), published_dir(self.sdir),
                (registered() if registered is not None else None) or endpoints, buffer=self.buffer,
                start_step=step, resume_from=resume_from, registered=registered, lock=thread.lock,
            )  # fmt: skip

        def await_workers(loop: ExploreLoop) -> bool:
            then = f", then exploring step {loop.explore_step} again"
            return bool(loop.pool.await_restarted(thread.stop, then))

        if self.resume_from is not None:
            start_step = int(self.resume_from["explore_step"])
        thread = ExplorerThread(
            build, start_step, self.cfg.explorer.max_restarts, self.resume_from, await_workers
        )
        self.explorer_thread = thread
        thread.start()

    def state_dict(self) -> dict[str, Any] | None:
        """explorer_thread: the in-memory buffer's groups not taken yet, where its ledger stands and
        the explorer's position after the last step it put (None for a buffer that outlives the
        process: it keeps its own)."""
        thread = self.explorer_thread
        if thread is None:
            return None
        with thread.lock:
            return {"buffer": self.buffer.state_dict(), "explorer": thread.position()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """What `state_dict` returned, before `start_explorer`."""
        self.buffer.load_state_dict(state["buffer"])
        self.resume_from = state["explorer"]
        log.info(
            "the in-memory buffer resumed at step %d with %d group(s) not taken yet; the explorer resumes at "
            "explore step %d", state["buffer"]["steps_taken"], self.buffer.stats().available,
            self.resume_from["explore_step"],
        )  # fmt: skip

    def close(self) -> None:
        if self.explorer_thread is not None:
            self.explorer_thread.close()
        self.buffer.close()

    def take(
        self, explore_step: int, step: int, schedule: SyncSchedule
    ) -> tuple[list[Experience], dict[str, float]]:
        """The groups of position `explore_step` for optimizer step `step`, with their metrics (the
        staleness dropped by algorithm.sample_strategy staleness_control)."""
        eb = self.cfg.buffer.trainer_input.experience_buffer
        start = time.perf_counter()
        taken = self._take(explore_step, eb.max_wait_s)
        self.exhausted = taken.exhausted
        self.next_step = self.buffer.stats().steps_taken if taken.exhausted else explore_step + 1
        groups = [g for g in taken.groups if not is_skipped(g)]  # the places of tasks the filter skipped
        exps = [e for g in groups for e in g]
        metrics = {
            "perf/buffer_wait_s": time.perf_counter() - start,
            "buffer/groups": float(len(groups)),
            "buffer/experiences": float(len(exps)),
        }
        if len(groups) < len(taken.groups):
            metrics["buffer/skipped_places"] = float(len(taken.groups) - len(groups))
        if taken.exhausted:
            log.info(
                "the explorers finished: the buffer's last %d group(s) at step %d", len(taken.groups), step
            )
        exps = schedule.drop_stale(
            exps, [e.policy_version for e in exps], step, metrics,
            enforce=self.cfg.algorithm.sample_strategy == "staleness_control",
        )  # fmt: skip
        if self.keys is not None:  # replay: groups trained on before
            keys = [(g[0].group_id, g[0].policy_version, tuple(g[0].response_token_ids)) for g in groups]
            metrics["buffer/groups_reused"] = float(sum(k in self.keys for k in keys))
            self.keys.update(keys)
        return exps, metrics

    def _take(self, explore_step: int, wait_s: float) -> Any:
        """The step's groups from the buffer; an explorer thread that failed meanwhile raises here."""
        from ..buffer.base import BufferTimeout

        deadline = time.monotonic() + wait_s
        while True:
            thread, peer = self.explorer_thread, self.explore_launch
            if thread is not None and thread.error is not None:
                raise RuntimeError(
                    f"the explorer thread failed: {thread.error} (after {thread.restarts} restart(s), "
                    "explorer.max_restarts)"
                ) from thread.error
            if peer is not None:
                if (change := peer.poll(wait_s)) is not None:
                    log.warning("%s", change)  # said within seconds, not after max_wait_s
                if self.heartbeat() == "stop":  # a Ctrl-C reaches the waiting trainer too
                    raise StopWhileWaiting
                if self.while_waiting is not None:
                    self.while_waiting()
            left = deadline - time.monotonic()
            chunk = 1.0 if peer is not None else 5.0 if thread is not None else left  # how often to look
            try:
                return self.buffer.take(explore_step, self.cfg.buffer.batch_size, min(left, chunk))
            except BufferTimeout:
                if left <= chunk:
                    raise
