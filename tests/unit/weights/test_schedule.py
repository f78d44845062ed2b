"""SyncSchedule: when each sync_style pushes weights, and which experiences max_staleness drops.
The in-process loop and the trainer.remote loop both follow it."""

from __future__ import annotations

from rlcore.core.config.schema import SynchronizerConfig
from rlcore.core.types import Experience
from rlcore.weights.schedule import SyncSchedule


def _syncs(schedule: SyncSchedule, steps: int) -> list[int]:
    """Run a loop like the trainer's (synced at step 0; before each rollout, then after each
    optimizer step) and return the steps at which it synced."""
    version, synced = 0, []
    for step in range(steps):
        if schedule.due_before_explore(step, version):
            version = step
            synced.append(step)
        if schedule.due_after_step(step + 1, version):
            version = step + 1
            synced.append(step + 1)
    return synced


def test_each_sync_style_syncs_when_documented() -> None:
    assert _syncs(SyncSchedule(SynchronizerConfig()), 4) == [1, 2, 3, 4]  # fixed, interval 1
    assert _syncs(SyncSchedule(SynchronizerConfig(sync_interval=3)), 7) == [3, 6]
    assert _syncs(SyncSchedule(SynchronizerConfig(sync_interval=2, sync_offset=3)), 7) == [3, 5, 7]
    assert _syncs(SyncSchedule(SynchronizerConfig(sync_style="trainer_driven")), 3) == [1, 2, 3]
    # explorer_driven: only before a rollout whose weights would lag more than max_staleness
    lazy = SyncSchedule(SynchronizerConfig(sync_style="explorer_driven", max_staleness=2))
    assert _syncs(lazy, 9) == [3, 6]
    assert _syncs(SyncSchedule(SynchronizerConfig(sync_style="explorer_driven")), 3) == [1, 2]


def test_stale_experiences_are_dropped_and_counted() -> None:
    exps = [Experience([1], [2], [0.0], 1.0, f"g{i}", policy_version=v) for i, v in enumerate([5, 3, 4, 2])]
    metrics: dict[str, float] = {}
    kept = SyncSchedule(SynchronizerConfig(max_staleness=1)).drop_stale(
        exps, [e.policy_version for e in exps], 5, metrics
    )
    assert [e.group_id for e in kept] == ["g0", "g2"]  # staleness 0 and 1 stay, 2 and 3 go
    assert metrics == {"rollout/staleness_mean": 1.5, "rollout/stale_dropped": 2.0}
    # without a bound nothing is dropped, but staleness is still reported
    metrics = {}
    assert SyncSchedule(SynchronizerConfig()).drop_stale(exps, [5, 5, 5, 5], 6, metrics) == exps
    assert metrics == {"rollout/staleness_mean": 1.0}


def test_an_explorer_on_the_buffer_is_bounded_in_the_versions_the_trainer_drops_in() -> None:
    """max_staleness is one unit, policy versions: with 2 optimizer steps per explore step, explore
    step 3 is trained on from step 6, so with max_staleness 1 it needs weights of version >= 5, and
    what it explores with them passes the trainer's filter at step 6 (and one older would not)."""
    schedule = SyncSchedule(SynchronizerConfig(max_staleness=1))
    need = schedule.oldest_for_explore(3, 2)
    assert need == 5
    exps = [Experience([1], [2], [0.0], 1.0, f"g{v}", policy_version=v) for v in (need, need - 1)]
    kept = schedule.drop_stale(exps, [e.policy_version for e in exps], 3 * 2, {})
    assert [e.policy_version for e in kept] == [need]
    assert schedule.oldest_for_explore(3, 1) == 2  # one optimizer step per explore step: as before
    assert schedule.oldest_for_explore(0, 2) == 0
    assert SyncSchedule(SynchronizerConfig()).oldest_for_explore(9, 2) == 0  # no bound
