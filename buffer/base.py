"""The ExperienceBuffer interface: where explorers put experience groups and the trainer takes them
(modes explore and train, and asynchronous both).

    put(groups)                       an explorer appends groups (a group: one task's experiences),
                                      each stored whole: a reader never sees part of one
    take(step, num_groups, timeout_s) the trainer's step `step`: the oldest unread groups the first
                                      time it is asked for, the same groups again when a restarted
                                      trainer asks for it (its checkpoint holds the step), so no
                                      group is trained twice or lost
    finish()                          this writer will put nothing more; once every writer did and
                                      the rest is read, take answers `exhausted`
    stats()                           counts of what was written and taken

Any number of writers; one reader (the trainer). The backends (one file each) keep the groups, the
ledger of which step took which groups, and the writers; the waiting is here.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..core.types import Experience

Group = list[Experience]

POLL_S = 0.2
"""How often a waiting take looks again (backends without notifications)."""


class BufferError(RuntimeError):
    """The buffer cannot do what was asked; str(e) is one line naming the buffer and the fix."""


def write_failed(reason: str, launch: str) -> str:
    """What to do after a write the storage refused for `reason` (an OS or database error's text),
    then which launch to resume (`launch`: explore for a put, train for the ledger)."""
    full = any(s in reason.lower() for s in ("no space", "disk is full", "disk full", "quota"))
    cause = "free space there" if full else "fix the cause"
    return f"{reason}: {cause}, then resume the {launch} launch with continue_from_checkpoint=true"


class BufferTimeout(BufferError):
    """A take waited its time out for groups that did not come."""


@dataclass
class Taken:
    groups: list[Group]
    exhausted: bool
    """Fewer groups than asked for: every writer finished and nothing else is left."""


@dataclass
class BufferStats:
    groups_written: int = 0
    experiences_written: int = 0
    groups_taken: int = 0
    experiences_taken: int = 0
    available: int = 0
    """Groups written and not taken yet."""
    writers: int = 0
    writers_finished: int = 0
    steps_taken: int = 0
    """The steps the reader took (the next one is this)."""


def new_writer_id(role: str = "explorer") -> str:
    """A writer id no other writer has (a restarted explorer is a new writer)."""
    return f"{role}-{uuid.uuid4().hex[:12]}"


class ExperienceBuffer(ABC):
    storage_type = ""

    def __init__(self, name: str, where: str, writer: str | None = None):
        self.name, self.where = name, where
        self.writer = writer or new_writer_id()

    def describe(self) -> str:
        return f"experience buffer '{self.name}' ({self.storage_type} {self.where})"

    # ------------------------------------------------------------------ writer side

    def put(self, groups: list[Group]) -> None:
        """Append `groups` (each non-empty, one task's experiences)."""
        if any(not g for g in groups):
            raise ValueError("an experience group is empty")
        if groups:
            self._put(groups)

    @abstractmethod
    def _put(self, groups: list[Group]) -> None: ...

    @abstractmethod
    def finish(self) -> None:
        """This writer will put nothing more."""

    # ------------------------------------------------------------------ reader side

    @abstractmethod
    def take(self, step: int, num_groups: int, timeout_s: float) -> Taken:
        """The groups of the trainer's step `step` (see the module's docstring); waits up to
        `timeout_s` for `num_groups` of them, then raises BufferTimeout."""

    @abstractmethod
    def stats(self) -> BufferStats: ...

    def groups_by_writer(self) -> dict[str, int] | None:
        """How many groups the storage holds of each writer (None: this storage cannot tell). A
        resumed explorer checks them against what it put (the storage must not have lost any)."""
        return None

    def close(self) -> None:  # noqa: B027 (most handles hold something; the memory store holds nothing)
        """Release what this handle holds (files, connections)."""


class LedgerBuffer(ExperienceBuffer):
    """A backend that holds the groups and the ledger itself (memory, file, sql); the waiting is here."""

    def take(self, step: int, num_groups: int, timeout_s: float) -> Taken:
        deadline = time.monotonic() + timeout_s
        while True:
            recorded = self._recorded(step)
            if recorded is not None:
                return Taken(recorded, exhausted=len(recorded) < num_groups)
            steps_taken = self._steps_taken()
            if step != steps_taken:
                raise BufferError(
                    f"{self.describe()}: the trainer asks for step {step}, but the buffer has taken {steps_taken} "
                    f"step(s): {self._why_not_next()}"
                )
            available, writers, finished = self._progress()
            done = writers > 0 and finished == writers
            if available >= num_groups or done:
                groups = self._claim(step, num_groups)
                return Taken(groups, exhausted=len(groups) < num_groups)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BufferTimeout(
                    f"{self.describe()}: step {step} waited {timeout_s:g} s for {num_groups} experience groups "
                    f"and {available} came ({writers} writer(s), {finished} finished): is the explorer running "
                    "(mode explore) and writing here? Raise experience_buffer.max_wait_s to wait longer"
                )
            self._wait(min(left, POLL_S))

    def _wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def _why_not_next(self) -> str:
        """Why a trainer can ask for a step that is not the next one, and the fix (one reader per
        buffer: the file and sql storages refuse a second one)."""
        if self.storage_type == "queue":
            return (
                "the queue lives in the memory of the launch that serves it, and restarting that launch lost its "
                "groups and ledger: the queue storage cannot resume a decoupled run; use "
                "buffer.trainer_input.experience_buffer.storage_type file or sql for a resumable decoupled run"
            )
        return (
            "steps are taken in order: did the storage lose its ledger's last steps (a damaged or restored "
            "database or file), or is the trainer's checkpoint of another buffer (experience_buffer.path or "
            "name changed)?"
        )

    @abstractmethod
    def _recorded(self, step: int) -> list[Group] | None:
        """The groups step `step` took, if it was taken."""

    @abstractmethod
    def _steps_taken(self) -> int: ...

    @abstractmethod
    def _progress(self) -> tuple[int, int, int]:
        """(groups available, writers, writers finished)."""

    @abstractmethod
    def _claim(self, step: int, num_groups: int) -> list[Group]:
        """Atomically take up to `num_groups` of the oldest unread groups as step `step`'s."""
