"""Taskset mixtures: each taskset's share of a batch, and batches as seeded and resumable as a
single taskset's."""

from __future__ import annotations

import pytest

from rlcore.core.data.taskset import MixtureStream, TaskStream, mixture_counts
from rlcore.core.types import Task


def test_counts_split_the_batch_by_weight_with_largest_remainders() -> None:
    assert mixture_counts(16, [1.0, 1.0]) == [8, 8]
    assert mixture_counts(16, [3.0, 1.0]) == [12, 4]
    assert mixture_counts(10, [1.0, 1.0, 1.0]) == [4, 3, 3]  # 3.33 each: the first gets the spare
    assert mixture_counts(7, [0.5, 0.25, 0.25]) == [3, 2, 2]  # 3.5, 1.75, 1.75: the .75s win
    assert sum(mixture_counts(13, [0.7, 0.2, 0.1])) == 13
    assert mixture_counts(4, [1.0, 0.01]) == [4, 0]  # validation refuses such a weight


def _tasks(name: str, n: int) -> list[Task]:
    return [Task(f"{name}-{i}", f"{name} {i}", source=name) for i in range(n)]


def test_a_mixture_batch_is_each_streams_batch_and_replays_exactly() -> None:
    a, b = TaskStream(_tasks("a", 20), 3, seed=1, shuffle=True), TaskStream(_tasks("b", 5), 1, seed=2, shuffle=True)
    mix = MixtureStream([a, b])
    assert (mix.batch_size, mix.batches_per_epoch, len(mix.tasks)) == (4, 6, 25)  # b's 5 batches, a's 6: the longest
    batches = [mix.batch(k) for k in range(12)]
    assert all([t.source for t in batch] == ["a", "a", "a", "b"] for batch in batches)
    assert batches == [MixtureStream([a, b]).batch(k) for k in range(12)]  # a resumed run: the same batches
    assert {t.task_id for batch in batches[:5] for t in batch[3:]} == {f"b-{i}" for i in range(5)}  # b's epoch
    assert [t.source for t in mix.extra(3, 1)] == ["a", "a", "a", "b"]
    with pytest.raises(ValueError, match="fewer than buffer.batch_size"):
        TaskStream(_tasks("c", 2), 3, seed=0, shuffle=False)
