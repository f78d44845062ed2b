"""A stage's step, one call whatever its experiences come from (plan.source), built once per stage by
`step_source`:

    responses, pairs          the taskset's rows: SFT on their responses, DPO on their pairs
                              (taskset_rows.RowsSource)
    rollouts                  explored in lock-step on the stage's engines (lockstep_source.py),
                              the next step's rollout started while this one trains
    buffer, explorer_thread   an experience buffer's groups (buffer_source.py): the algorithm's
                              step on them, or DPO on the pairs the explorer formed

`step(explore_step, global_step)` trains one step and returns its metrics and the trainer's global
step after it; `next_explore_step` is where the following step reads; `exhausted`, whether the
source ran dry (an experience buffer whose explorers finished)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.config import RLCoreConfig
from ..core.types import Experience, episode_starts
from ..weights.schedule import SyncSchedule
from .buffer_source import BufferSource
from .lockstep_source import LockstepSource
from .step_sizes import mini_batches
from .taskset_rows import RowsSource, explored_pairs

Metrics = dict[str, float]
TrainFn = Callable[[list[Experience], int, int], tuple[Metrics, int]]
"""The algorithm's step on explore step e's experiences at global step g: (metrics, global step after)."""
Mixture = Callable[[list[Experience]], Metrics]


class StepSource(Protocol):
    @property
    def exhausted(self) -> bool: ...

    def step(self, explore_step: int, global_step: int) -> tuple[Metrics, int]: ...

    def next_explore_step(self, explore_step: int) -> int: ...


@dataclass
class RowsStep:
    """SFT or DPO on the taskset's rows of each explore step."""

    rows: RowsSource
    stream: Any  # TaskStream | SelectingStream | MixtureStream
    exhausted: bool = False

    def step(self, explore_step: int, global_step: int) -> tuple[Metrics, int]:
        return self.rows.step(self.stream.batch(explore_step), global_step)

    def next_explore_step(self, explore_step: int) -> int:
        return explore_step + 1


@dataclass
class LockstepStep:
    """The step's rollout (lockstep_source.py), the next one started ahead, then the algorithm's step."""

    source: LockstepSource
    train: TrainFn
    mixture: Mixture
    cfg: RLCoreConfig
    total_explore_steps: int
    total_train_steps: int
    exhausted: bool = False

    def step(self, explore_step: int, global_step: int) -> tuple[Metrics, int]:
        exps, metrics = self.source.take(explore_step, global_step, self.mixture)
        following, updates = explore_step + 1, len(mini_batches(len(exps), self.cfg, episode_starts(exps)))
        last = following >= self.total_explore_steps or global_step + updates >= self.total_train_steps
        self.source.start_ahead(following, last)
        trained, global_step = self.train(exps, explore_step, global_step)
        metrics.update(trained)
        metrics.update(self.source.wait())  # the sync, evaluation and checkpoint find the engines idle
        return metrics, global_step

    def next_explore_step(self, explore_step: int) -> int:
        return explore_step + 1


@dataclass
class BufferStep:
    """A step on the experience buffer's groups, trained on like explored ones (DPO: on the pairs
    the explorer formed)."""

    source: BufferSource
    train: TrainFn
    mixture: Mixture
    schedule: SyncSchedule
    rows: RowsSource
    completions: Callable[[list[Experience], int, int], None]
    pairs: bool

    @property
    def exhausted(self) -> bool:
        return self.source.exhausted

    def step(self, explore_step: int, global_step: int) -> tuple[Metrics, int]:
        exps, metrics = self.source.take(explore_step, global_step, self.schedule)
        metrics.update(self.mixture(exps))
        if self.pairs and exps:  # DPO on the pairs the explorer formed
            pairs = explored_pairs(exps)
            per_pair = [pairs[i : i + 2] for i in range(0, len(pairs), 2)]
            trained, global_step = self.rows.train(per_pair, global_step)
            self.completions(exps, explore_step, global_step)
        else:
            trained, global_step = self.train(exps, explore_step, global_step)
        metrics.update(trained)
        return metrics, global_step

    def next_explore_step(self, explore_step: int) -> int:
        return self.source.next_step


def step_source(
    plan: Any, cfg: RLCoreConfig, rows: RowsSource, stream: Any, train: TrainFn, mixture: Mixture,
    schedule: SyncSchedule, completions: Callable[[list[Experience], int, int], None],
    lockstep: LockstepSource | None, buffer: BufferSource | None, totals: tuple[int, int],
) -> StepSource:  # fmt: skip
    """The stage's step for its plan's source (`buffer` opened for plan.reads_buffer, `lockstep`
    built for plan.explores); `totals`: its planned (explore steps, optimizer steps)."""
    if plan.reads_buffer:
        assert buffer is not None
        return BufferStep(buffer, train, mixture, schedule, rows, completions, plan.trains_on == "pairs")
    if plan.explores:
        assert lockstep is not None
        return LockstepStep(lockstep, train, mixture, cfg, *totals)
    return RowsStep(rows, stream)
