"""The replay buffer (buffer.trainer_input.experience_buffer.replay_buffer, storage_type queue): the
trainer's groups are chosen by priority among the new ones and those it trained on before.

Every group waits in one pool. A step takes the `num_groups` ready groups of highest priority (the
oldest first among equals); each taken group's use count goes up, and with reuse_cooldown_time it is
ready again that many seconds later (without, it leaves the pool: the replay buffer then only
orders). Past `capacity` groups the lowest-priority ones leave. A priority function is
`fn(group: list[Experience], uses: int, **priority_fn_args) -> float` (higher: taken first),
built in below or a user's by import path. The ledger of which step took which groups stays as
in the queue without replay (memory.py): a step asked for again gets the same groups.
"""

from __future__ import annotations

import functools
import inspect
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.registry import Registry, import_path
from .base import Group
from .memory import MemoryBuffer, decode_group, encode_group

PRIORITY_FNS = Registry(
    "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn",
    {
        "linear_decay": "rlcore.buffer.replay:linear_decay",
        "reward_spread": "rlcore.buffer.replay:reward_spread",
    },
)

Priority = Callable[[Group, int], float]


def linear_decay(group: Group, uses: int, decay: float = 2.0) -> float:
    """The policy version that generated the group, less `decay` per time it was trained on: the
    freshest first, each reuse pushing a group back by `decay` versions."""
    return float(group[0].policy_version) - decay * uses


def reward_spread(group: Group, uses: int, decay: float = 1.0) -> float:
    """The spread (population standard deviation) of the group's rewards, less `decay` per use:
    groups whose samples disagree, which carry a group-relative advantage, first."""
    rewards = [e.reward for e in group]
    return (statistics.pstdev(rewards) if len(rewards) > 1 else 0.0) - decay * uses


def resolve_priority(name: str, args: dict[str, Any]) -> Priority:
    """`name` (registered, or an import path 'pkg.mod:fn') with `args` bound; ValueError naming
    the key when the function cannot be found or does not take those args."""
    key = PRIORITY_FNS.key_path
    fn = (
        PRIORITY_FNS.resolve(name) if name in PRIORITY_FNS or ":" not in name else import_path(name, what=key)
    )
    if not callable(fn):
        raise ValueError(f"{key} '{name}' is not callable; give fn(group, uses, **args) -> float")
    try:
        inspect.signature(fn).bind([], 0, **args)
    except TypeError as e:
        raise ValueError(
            f"{key.removesuffix('priority_fn')}priority_fn_args {args} do not fit {name}: {e}"
        ) from None
    return functools.partial(fn, **args)


@dataclass(frozen=True)
class Replay:
    priority: Priority
    cooldown_s: float | None
    """Seconds before a taken group is ready again (None: never taken again)."""
    capacity: int

    @classmethod
    def from_config(cls, rb: Any) -> Replay:
        return cls(
            resolve_priority(rb.priority_fn, dict(rb.priority_fn_args)), rb.reuse_cooldown_time, rb.capacity
        )


@dataclass(eq=False)
class _Entry:
    group: Group
    seq: int
    uses: int = 0
    ready_at: float = 0.0
    priority: float = field(default=0.0)


class ReplayMemoryBuffer(MemoryBuffer):
    """The in-memory queue with replay: served by the mode-train launch's controller, or in the
    process of an asynchronous `both` run."""

    def __init__(self, name: str, replay: Replay, where: str = "in memory", writer: str | None = None):
        super().__init__(name, where, writer)
        self.replay = replay
        self._pool: list[_Entry] = []
        self._seq = 0
        self._reused = 0

    def describe(self) -> str:
        return super().describe().removesuffix(")") + ", replay)"

    def _store(self, groups: list[Group]) -> None:
        for g in groups:
            self._pool.append(_Entry(g, self._seq, priority=self.replay.priority(g, 0)))
            self._seq += 1
        self._evict()

    def _available(self) -> int:
        """Groups ready now (not cooling down)."""
        now = time.monotonic()
        return sum(1 for e in self._pool if e.ready_at <= now)

    def _claim(self, step: int, num_groups: int) -> list[Group]:
        with self._changed:
            assert step == self._first + len(self._steps)
            now = time.monotonic()
            ready = sorted((e for e in self._pool if e.ready_at <= now), key=lambda e: (-e.priority, e.seq))
            chosen = ready[:num_groups]
            for e in chosen:
                self._reused += e.uses > 0
                e.uses += 1
                if self.replay.cooldown_s is None:
                    self._pool.remove(e)
                else:
                    e.ready_at = now + self.replay.cooldown_s
                    e.priority = self.replay.priority(e.group, e.uses)
            self._steps.append([e.group for e in chosen])
            return [e.group for e in chosen]

    def _pending_state(self) -> dict[str, Any]:
        """The pool: every group with its uses, priority and the seconds until it is ready again."""
        now = time.monotonic()
        pool = [{"group": encode_group(e.group), "seq": e.seq, "uses": e.uses, "priority": e.priority,
                 "ready_in_s": max(0.0, e.ready_at - now)} for e in self._pool]  # fmt: skip
        return {"pool": pool, "seq": self._seq, "reused": self._reused}

    def _load_pending(self, state: dict[str, Any]) -> None:
        now = time.monotonic()
        for e in state["pool"]:
            group = decode_group(e["group"], self.describe())
            self._pool.append(_Entry(group, e["seq"], e["uses"], now + e["ready_in_s"], e["priority"]))
        self._seq, self._reused = int(state["seq"]), int(state["reused"])

    def _evict(self) -> None:
        """Past capacity, the lowest-priority groups (the newest first among equals: they are the
        ones not yet counted on) leave the pool."""
        over = len(self._pool) - self.replay.capacity
        if over > 0:
            for e in sorted(self._pool, key=lambda e: (e.priority, -e.seq))[:over]:
                self._pool.remove(e)

    def reused(self) -> int:
        """Groups taken again after a first time."""
        with self._changed:
            return self._reused
