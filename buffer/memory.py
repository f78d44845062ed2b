"""The queue storage's groups, in memory: held by the controller that serves them over gRPC
(service.py), or used in process by an asynchronous `both` run. Gone when that process ends: a
restarted trainer re-reads the steps it took only while the process that holds them lives, except
what `state_dict` kept (an asynchronous run saves it with each checkpoint: the groups not taken yet
and where the ledger stands)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from .base import BufferStats, Group, LedgerBuffer
from .records import from_record, to_record


class MemoryBuffer(LedgerBuffer):
    storage_type = "queue"

    def __init__(self, name: str, where: str = "in memory", writer: str | None = None):
        super().__init__(name, where, writer)
        self._changed = threading.Condition()
        self._unread: deque[Group] = deque()
        self._steps: list[list[Group]] = []
        """What each step took, in order, from step `_first` on."""
        self._first = 0
        """The first step `_steps` holds (a restored buffer knows the later ones only)."""
        self._writers: set[str] = set()
        self._finished: set[str] = set()
        self._written = [0, 0]
        """Groups, experiences."""

    def put_from(self, writer: str, groups: list[Group]) -> int:
        """`put` on behalf of `writer` (the gRPC service's callers); the groups available after it."""
        with self._changed:
            self._writers.add(writer)
            self._store(groups)
            self._written[0] += len(groups)
            self._written[1] += sum(len(g) for g in groups)
            self._changed.notify_all()
            return self._available()

    def _store(self, groups: list[Group]) -> None:
        """Keep newly put groups (under the lock)."""
        self._unread.extend(groups)

    def _available(self) -> int:
        """Groups a step could take now (under the lock)."""
        return len(self._unread)

    def finish_writer(self, writer: str) -> None:
        with self._changed:
            self._writers.add(writer)
            self._finished.add(writer)
            self._changed.notify_all()

    def _put(self, groups: list[Group]) -> None:
        self.put_from(self.writer, groups)

    def finish(self) -> None:
        self.finish_writer(self.writer)

    def _wait(self, seconds: float) -> None:
        with self._changed:
            self._changed.wait(seconds)

    def _recorded(self, step: int) -> list[Group] | None:
        with self._changed:
            index = step - self._first
            return list(self._steps[index]) if 0 <= index < len(self._steps) else None

    def _steps_taken(self) -> int:
        with self._changed:
            return self._first + len(self._steps)

    def _progress(self) -> tuple[int, int, int]:
        with self._changed:
            return self._available(), len(self._writers), len(self._finished)

    def _claim(self, step: int, num_groups: int) -> list[Group]:
        with self._changed:
            assert step == self._first + len(self._steps)
            groups = [self._unread.popleft() for _ in range(min(num_groups, len(self._unread)))]
            self._steps.append(groups)
            return groups

    # ------------------------------------------------------------------ saved with a checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The steps taken so far and every group not taken yet (JSON-ready); the writers are not
        kept (the explorer that refills it is a new writer)."""
        with self._changed:
            return {"steps_taken": self._first + len(self._steps), **self._pending_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """What `state_dict` returned, into an empty buffer: the next take is step `steps_taken`."""
        with self._changed:
            assert not self._steps and self._available() == 0, "load_state_dict needs an empty buffer"
            self._first = int(state["steps_taken"])
            self._load_pending(state)
            self._changed.notify_all()

    def _pending_state(self) -> dict[str, Any]:
        """The groups not taken yet (under the lock)."""
        return {"unread": [encode_group(g) for g in self._unread]}

    def _load_pending(self, state: dict[str, Any]) -> None:
        self._unread.extend(decode_group(g, self.describe()) for g in state["unread"])

    def stats(self) -> BufferStats:
        with self._changed:
            taken = [g for step in self._steps for g in step]
            return BufferStats(
                groups_written=self._written[0], experiences_written=self._written[1],
                groups_taken=len(taken), experiences_taken=sum(len(g) for g in taken),
                available=self._available(), writers=len(self._writers), writers_finished=len(self._finished),
                steps_taken=self._first + len(self._steps),
            )  # fmt: skip


def encode_group(group: Group) -> list[dict[str, Any]]:
    return [to_record(e) for e in group]


def decode_group(records: list[dict[str, Any]], where: str) -> Group:
    return [from_record(r, where) for r in records]
