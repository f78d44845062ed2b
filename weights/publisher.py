"""A decoupled run's trainer side of the weights (plan.publishes): each version it publishes for the
explorers, as a folder (plan.explorer_weights publish), or (nccl) pushed over a process group to the
rollout workers the explore launch registered, after the first version, which is always a folder
(the workers start from it). A push that fails, or finds no workers registered, publishes a folder
instead: the explorer loads whichever is newer (follower.py, its half; publish.py says what the
two launches write there)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..core.config.plan import StagePlan
from .publish import record_push, registered_receivers

log = logging.getLogger("rlcore.loop")


class PublishingTrainer(Protocol):
    """The two calls a Publisher makes of the trainer (runtime/handles.py TrainerHandle)."""

    def publish_weights(self, folder: str) -> tuple[int, Any]:
        """The next version written in `folder`: (version, what was sent: its `seconds`)."""
        ...

    def push_weights(self, endpoints: list[str], transport: str, token: str) -> tuple[int, float]:
        """The weights pushed to the workers at `endpoints`: (the policy version they got, seconds)."""
        ...


class Publisher:
    def __init__(self, plan: StagePlan, handle: PublishingTrainer, folder: str):
        self.handle, self.folder = handle, folder
        self.by_group = plan.explorer_weights == "nccl"
        self.step = -1
        """The trainer step of the newest version published (a folder or a push)."""
        self.pushed_to: list[str] = []
        """The workers the newest push reached."""

    def publish(self, step: int) -> dict[str, float]:
        """The weights of optimizer step `step` for the explorers."""
        workers, _, token = registered_receivers(self.folder) if self.by_group and self.step >= 0 else ([], -1, "")
        first, self.step = self.step < 0, step
        if workers:
            try:
                number, seconds = self.handle.push_weights(workers, "nccl", token)
            except Exception as e:  # the group did not form, or a worker failed in the push
                if registered_receivers(self.folder)[0] == workers:
                    log.warning("could not push the weights to the explorer's rollout workers %s (%s): "
                                "publishing a folder instead", ", ".join(workers), e)  # fmt: skip
                else:  # the explorer finished (or changed its workers) during the push: nothing failed
                    log.info("the explorer's rollout workers %s left during the push (it finished, or changed "
                             "them): publishing a folder", ", ".join(workers))  # fmt: skip
            else:
                record_push(self.folder, step, number)
                self.pushed_to = workers
                log.info("pushed the weights of step %d to the explorer's rollout worker(s) %s over a group "
                         "(policy version %d)", step, ", ".join(workers), number)  # fmt: skip
                return {"perf/publish_s": seconds, "sync/published_version": float(step)}
        elif self.by_group and not first:
            log.info("no rollout workers of an explorer registered in %s (none yet, or it finished): "
                     "publishing a folder", self.folder)
        version, synced = self.handle.publish_weights(self.folder)
        log.info("published version %d of the weights for the explorers", version)
        return {"perf/publish_s": synced.seconds, "sync/published_version": float(version)}

    def on_wait(self) -> dict[str, float]:
        """While the trainer waits for experiences: push the newest version again when the explorer
        registered other workers (a restarted one) that do not all hold it (else the explorer, waiting
        for them, would wait for a trainer that waits for it)."""
        if not self.by_group or self.step < 0:
            return {}
        workers, holds, _ = registered_receivers(self.folder)
        if not workers or workers == self.pushed_to or holds >= self.step:
            return {}
        log.info("the explorer's rollout workers are now %s: pushing step %d to them", ", ".join(workers), self.step)
        return self.publish(self.step)
