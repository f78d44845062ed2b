"""Training tasks chosen by what the policy has shown on them (buffer.explorer_input.task_selection):
each task's history (task_history.py), difficulty filtering and a curriculum.

    filter      a task whose recent pass rate is >= too_easy (always solved) or <= too_hard (never
                solved) is passed over when its turn comes, until readmit_after explore steps after
                its last exploration (then it runs again and its new history decides); with
                keep_probability > 0 it is down-weighted instead (explored with that chance); an
                open task takes its turn (refill), or without refill the step is smaller
    curriculum  a step draws from the easiest part of the tasks the filter leaves open (by recent
                pass rate, or by a column): start_fraction of them at step 0, all after ramp_steps
                explore steps

A selecting stream walks each epoch's seeded order as TaskStream does and passes over the tasks the
filter or the curriculum leaves out (they have their turn again in the next epoch). Where it
stands (epoch, offset) and the history are the selection's state, saved with the run's checkpoints,
so a resumed run draws the batches the run would have drawn. When fewer tasks are open than a batch
needs, the filtered ones explored longest ago fill it (counted: tasks/readmitted_early).

Plain Python (no torch).
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..config.schema import TaskSelectionConfig
from ..types import Task
from .task_history import TaskHistory
from .taskset_check import is_number

log = logging.getLogger("rlcore.tasks")

OUTSIDE = "curriculum"
"""A task the curriculum does not open yet (its state in a draw)."""


def selects(cfg: TaskSelectionConfig) -> bool:
    """Whether a stage selects its tasks by their history (a filter or a curriculum is on)."""
    return cfg.difficulty_filter.enable or cfg.curriculum.order != "none"


class TaskSelection:
    """The difficulty filter and the curriculum of one stage over one history, which a mixture's
    streams share (task ids are unique per taskset); it holds the state of every stream it selects for."""

    def __init__(self, cfg: TaskSelectionConfig, key_path: str):
        self.cfg, self.key_path = cfg, key_path
        self.history = TaskHistory(cfg.history_window, cfg.success_reward)
        self.streams: list[SelectingStream] = []

    def record(self, exps: Iterable[Any], step: int) -> None:
        """Explore step `step`'s experiences into the history (before any is renamed: .group_id is the task's id)."""
        self.history.record(exps, step)

    def filtered(self, task: Task, step: int) -> str | None:
        """'easy' or 'hard' when the filter passes `task` over at explore step `step`, else None."""
        f = self.cfg.difficulty_filter
        rec = self.history.get(task.task_id)
        if not f.enable or rec is None or step - rec.last_step >= f.readmit_after:
            return None
        if f.too_easy is not None and rec.pass_rate >= f.too_easy:
            return "easy"
        if f.too_hard is not None and rec.pass_rate <= f.too_hard:
            return "hard"
        return None

    def opened(
        self, tasks: list[Task], step: int, at_least: int, candidates: list[int] | None = None
    ) -> list[bool] | None:
        """Which of `tasks` the curriculum opens at explore step `step`: the easiest share of the
        `candidates` (their indices: the tasks the filter leaves open; None: all), at least
        `at_least` of them; None: all."""
        c = self.cfg.curriculum
        if c.order == "none":
            return None
        pool = list(range(len(tasks))) if candidates is None else candidates
        fraction = c.start_fraction + (1.0 - c.start_fraction) * min(1.0, step / c.ramp_steps)
        size = max(at_least, math.ceil(len(pool) * fraction))
        if size >= len(pool):
            return None
        ranked = sorted(pool, key=lambda j: (self._difficulty(tasks[j]), j))
        inside = [False] * len(tasks)
        for j in ranked[:size]:
            inside[j] = True
        return inside

    def _difficulty(self, task: Task) -> float:
        c = self.cfg.curriculum
        if c.order == "column":
            return float(task.metadata[str(c.column)])
        rec = self.history.get(task.task_id)
        return 1.0 - (c.unseen_pass_rate if rec is None else rec.pass_rate)

    def check_column(self, tasks: list[Task], key_path: str) -> None:
        """curriculum.order column: every task's column holds a number."""
        c = self.cfg.curriculum
        if c.order != "column":
            return
        key = f"{self.key_path}.curriculum.column"
        for t in tasks:
            value = t.metadata.get(str(c.column))
            if not is_number(value):
                raise ValueError(
                    f"{key}: task {t.task_id} of {key_path} has {value!r} in column '{c.column}'; the curriculum "
                    "orders tasks by a number there (smaller: easier): fill it in every row, or use order history"
                )

    # ------------------------------------------------------------------ state and metrics

    def state_dict(self, next_index: int) -> dict[str, Any]:
        """The history and where each stream stands before it draws batch `next_index`."""
        return {"history": self.history.state_dict(), "streams": [s.position(next_index) for s in self.streams]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state["history"])
        for stream, position in zip(self.streams, state["streams"], strict=True):
            stream.restore(position)

    def metrics(self, index: int) -> dict[str, float]:
        """Batch `index`'s draw (tasks skipped, pool sizes; summed over a mixture's streams) and the history's."""
        out: Counter[str] = Counter()
        for s in self.streams:
            out.update(s.drawn_metrics(index))
        return {**{k: float(v) for k, v in out.items()}, **self.history.metrics()}


class SelectingStream:
    """Batches of a TaskStream's size whose tasks `selection` chooses: the walk over each epoch's
    order (the TaskStream's) passes over the tasks it leaves out; batch(index) must come in order
    (asking again returns the same batch)."""

    KEEP = 4
    """Batches drawn that are remembered (a rollout started ahead, a step explored again)."""

    def __init__(self, base: Any, selection: TaskSelection):
        """`base`: the TaskStream (taskset.py) whose tasks, batch size, seed and epoch order it walks."""
        self.base, self.selection = base, selection
        self.tasks, self.batch_size, self.seed = base.tasks, base.batch_size, base.seed
        self.batches_per_epoch = base.batches_per_epoch
        selection.streams.append(self)
        self.epoch = self.offset = 0
        self.drawn: dict[int, tuple[list[Task], tuple[int, int], dict[str, int]]] = {}
        """index -> (batch, position before it, its draw's counts)."""
        self._orders: dict[int, list[int]] = {}
        self.warned = False
        """Whether a batch had to readmit filtered tasks early (said once, then counted)."""

    def batch(self, index: int) -> list[Task]:
        if index not in self.drawn:
            before = (self.epoch, self.offset)
            picked, counts = self._draw(index)
            self.drawn[index] = ([self.tasks[j] for j in picked], before, counts)
            for old in [i for i in self.drawn if i <= index - self.KEEP]:
                del self.drawn[old]
        return self.drawn[index][0]

    def extra(self, index: int, round_: int) -> list[Task]:
        """Dynamic sampling's round `round_` for batch `index`: distinct open tasks (the others when
        too few are open), the same whenever asked again."""
        states = self._states(index)
        rng = random.Random((self.seed * 1_000_003 + index) * 1_009 + round_)
        open_ = [j for j, s in enumerate(states) if s is None]
        picked = rng.sample(open_, min(len(open_), self.batch_size))
        if len(picked) < self.batch_size:
            rest = [j for j, s in enumerate(states) if s is not None]
            picked += rng.sample(rest, self.batch_size - len(picked))
        return [self.tasks[j] for j in picked]

    def position(self, next_index: int) -> list[int]:
        """(epoch, offset) before batch `next_index` is drawn."""
        if next_index in self.drawn:
            return list(self.drawn[next_index][1])
        return [self.epoch, self.offset]

    def restore(self, position: list[int]) -> None:
        self.epoch, self.offset = int(position[0]), int(position[1])
        self.drawn = {}

    def drawn_metrics(self, index: int) -> dict[str, int]:
        return self.drawn[index][2] if index in self.drawn else {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            self._orders = {epoch: self.base.order(epoch)}
        return self._orders[epoch]

    def _states(self, index: int) -> list[str | None]:
        """Each task's state at batch `index`: None (open), 'easy' or 'hard' (filtered), OUTSIDE (the
        curriculum, which ranks the tasks the filter leaves, has not opened it yet)."""
        sel = self.selection
        states = [sel.filtered(t, index) for t in self.tasks]
        inside = sel.opened(self.tasks, index, self.batch_size, [j for j, s in enumerate(states) if s is None])
        if inside is None:
            return states
        return [OUTSIDE if s is None and not inside[j] else s for j, s in enumerate(states)]

    def _draw(self, index: int) -> tuple[list[int], dict[str, int]]:
        """The task indices of batch `index`, walking on from where the stream stands, and the counts."""
        states = self._states(index)
        held = Counter(states)
        counts = {"tasks/pool_open": held[None], "tasks/pool_easy": held["easy"], "tasks/pool_hard": held["hard"]}
        if self.selection.cfg.curriculum.order != "none":
            counts["tasks/pool_closed"] = held[OUTSIDE]
        refill = self.selection.cfg.difficulty_filter.refill
        if held[None] < (self.batch_size if refill else 1):
            return self._too_few(index, states, counts)
        keep = self.selection.cfg.difficulty_filter.keep_probability
        rng = random.Random(f"{self.seed}:{index}")
        picked: list[int] = []
        skipped: Counter[str] = Counter()
        turns = 0  # without refill: the batch is the open tasks of batch_size turns (at least one)
        while len(picked) < self.batch_size and (refill or turns < self.batch_size or not picked):
            turns += 1
            if self.offset >= len(self.tasks):
                self.epoch, self.offset = self.epoch + 1, 0
            j = self._order(self.epoch)[self.offset]
            self.offset += 1
            s = states[j]
            if j in picked:
                continue
            if s is None or (s != OUTSIDE and keep > 0 and rng.random() < keep):
                picked.append(j)
            else:
                skipped[str(s)] += 1
        counts.update({f"tasks/skipped_{k}": v for k, v in skipped.items()})
        counts["tasks/skipped"] = skipped["easy"] + skipped["hard"]
        counts["tasks/drawn"] = len(picked)
        return picked, counts

    def _too_few(self, index: int, states: list[str | None], counts: dict[str, int]) -> tuple[list[int], dict[str, int]]:
        """Fewer tasks open than a batch (without refill: none open): every open one, then the
        filtered ones explored longest ago (then those the curriculum keeps closed), to a batch (without
        refill: one task); the walk does not move."""
        history = self.selection.history

        def since(j: int) -> int:
            rec = history.get(self.tasks[j].task_id)
            return -1 if rec is None else rec.last_step

        picked = [j for j, s in enumerate(states) if s is None]
        size = self.batch_size if self.selection.cfg.difficulty_filter.refill else 1  # without refill: one
        for outside in (False, True):
            rest = [j for j, s in enumerate(states) if s is not None and (s == OUTSIDE) == outside]
            picked += sorted(rest, key=lambda j: (since(j), j))[: max(0, size - len(picked))]
        early = len(picked) - counts["tasks/pool_open"]
        warned, self.warned = self.warned, True
        (log.debug if warned else log.warning)(
            "explore step %d: %d task(s) open, fewer than the batch's %d: %d filtered one(s) explored longest ago "
            "fill it (lower task_selection.difficulty_filter.readmit_after, or loosen too_easy/too_hard)",
            index, counts["tasks/pool_open"], self.batch_size, early,
        )  # fmt: skip
        return picked, {**counts, "tasks/readmitted_early": early, "tasks/drawn": len(picked)}
