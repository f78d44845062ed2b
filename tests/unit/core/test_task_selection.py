"""Task history, difficulty filtering and curriculum (core/data/task_selection.py): what a stream
draws, that a restored state draws the same, and the refusals of the config keys."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlcore.core.config import ConfigError
from rlcore.core.config.schema import TaskSelectionConfig
from rlcore.core.data.task_selection import SelectingStream, TaskSelection
from rlcore.core.data.taskset import MixtureStream, TaskStream
from rlcore.core.types import Task

from ..config.minimal import resolve


def tasks(n: int, name: str = "t") -> list[Task]:
    return [Task(task_id=f"{name}-{i}", source=name, prompt=str(i), answer="1", metadata={"level": n - i}) for i in range(n)]


def exp(group_id: str, reward: float, episode_id: str = "") -> SimpleNamespace:
    """What the history reads of an Experience."""
    return SimpleNamespace(group_id=group_id, reward=reward, episode_id=episode_id)


def selection(**filter_args) -> TaskSelection:
    cfg = TaskSelectionConfig()
    cfg.difficulty_filter.enable = True
    for k, v in filter_args.items():
        setattr(cfg.difficulty_filter, k, v)
    return TaskSelection(cfg, "buffer.explorer_input.task_selection")


def solve(sel: TaskSelection, batch: list[Task], step: int, solved: set[str], n: int = 4) -> None:
    """Record `n` responses per task: all right for the tasks in `solved`, half right for the rest."""
    sel.record(
        [exp(t.task_id, float(t.task_id in solved or i % 2)) for t in batch for i in range(n)],
        step,
    )


def run(stream: SelectingStream, steps: range, solved: set[str]) -> list[list[str]]:
    drawn = []
    for step in steps:
        batch = stream.batch(step)
        solve(stream.selection, batch, step, solved)
        drawn.append([t.task_id for t in batch])
    return drawn


def test_the_history_keeps_each_tasks_recent_pass_rate_over_its_window() -> None:
    sel = selection(readmit_after=100)
    sel.cfg.history_window = 2
    sel.history.window = 2
    t = tasks(1)
    solve(sel, t, 0, set())
    solve(sel, t, 3, {"t-0"})
    solve(sel, t, 5, {"t-0"})
    rec = sel.history.get("t-0")
    assert rec.pass_rates == [1.0, 1.0] and rec.reward_means == [1.0, 1.0]
    assert rec.last_step == 5 and rec.explored == 3
    solve(sel, t, 6, set())
    assert sel.history.get("t-0").pass_rate == 0.75
    # an episode split into several samples (a re-rendered history) counts once, with its reward
    sel.record([exp("t-0", 0.0, "e1"), exp("t-0", 1.0, "e1"), exp("t-0", 0.0, "e2")], 7)
    assert sel.history.get("t-0").pass_rates[-1] == 0.5


def test_always_solved_tasks_are_passed_over_until_readmitted() -> None:
    sel = selection(readmit_after=6)
    stream = SelectingStream(TaskStream(tasks(16), 4, 0, True), sel)
    solved = {f"t-{i}" for i in range(0, 16, 2)}  # half the tasks: always solved
    drawn = run(stream, range(4), solved)  # epoch 0: every task once, nothing known before
    assert sorted(sum(drawn, [])) == sorted(t.task_id for t in stream.tasks)
    later = run(stream, range(4, 6), solved)  # epoch 1: the solved half is skipped
    assert not set(sum(later, [])) & solved
    assert stream.drawn_metrics(4)["tasks/skipped_easy"] > 0
    assert sel.metrics(5)["tasks/pool_easy"] == 8 and sel.metrics(5)["tasks/pool_open"] == 8
    # six steps after their last exploration the solved ones are open again
    assert {t.task_id for t in stream.tasks if sel.filtered(t, 9) == "easy"} < solved
    assert all(sel.filtered(t, 3 + 6) is None for t in stream.tasks if sel.history.get(t.task_id).last_step <= 3)


def test_without_refill_a_step_explores_only_the_open_tasks_of_its_turns() -> None:
    """refill false: the tasks passed over are not replaced, so the epoch's order advances a batch's
    worth of turns per step and the step is smaller: the solved half's rollouts are not spent."""
    solved = {f"t-{i}" for i in range(0, 16, 2)}
    refilled = SelectingStream(TaskStream(tasks(16), 4, 0, True), selection(readmit_after=100))
    shrunk = SelectingStream(TaskStream(tasks(16), 4, 0, True), selection(readmit_after=100, refill=False))
    for stream in (refilled, shrunk):
        run(stream, range(4), solved)  # epoch 0: nothing known, every task once
    later_refilled, later_shrunk = run(refilled, range(4, 8), solved), run(shrunk, range(4, 8), solved)
    assert [len(b) for b in later_refilled] == [4] * 4
    assert all(1 <= len(b) <= 4 for b in later_shrunk) and sum(len(b) for b in later_shrunk) <= 9
    # epoch 1's open half (and, where a window held no open task, the walk on into epoch 2)
    assert set(sum(later_shrunk, [])) == {t.task_id for t in shrunk.tasks} - solved
    assert [shrunk.drawn_metrics(i)["tasks/drawn"] for i in range(4, 8)] == [len(b) for b in later_shrunk]
    # a window of turns with no open task still explores one (the walk goes on to find it)
    only_one = SelectingStream(TaskStream(tasks(8), 4, 0, False), selection(readmit_after=100, refill=False))
    run(only_one, range(2), {f"t-{i}" for i in range(8)} - {"t-7"})
    assert [t.task_id for t in only_one.batch(2)] == ["t-7"]


def test_never_solved_tasks_are_hard_and_thresholds_can_be_off() -> None:
    sel = selection(too_easy=None, too_hard=0.0)
    t = tasks(2)
    sel.record([exp("t-0", 0.0)] * 4 + [exp("t-1", 1.0)] * 4, 0)
    assert sel.filtered(t[0], 1) == "hard" and sel.filtered(t[1], 1) is None


def test_keep_probability_down_weights_and_draws_the_same_from_the_seed() -> None:
    def draws(keep: float) -> list[list[str]]:
        sel = selection(readmit_after=100, keep_probability=keep)
        return run(SelectingStream(TaskStream(tasks(32), 4, 3, True), sel), range(24), {f"t-{i}" for i in range(16)})

    skipped, weighted = draws(0.0), draws(0.5)
    easy = {f"t-{i}" for i in range(16)}
    late = lambda d: sum(t in easy for b in d[8:] for t in b)  # noqa: E731 (after the first epoch)
    assert late(skipped) < late(weighted) < sum(len(b) for b in weighted[8:])
    assert weighted == draws(0.5)


def test_when_too_few_tasks_are_open_those_explored_longest_ago_fill_the_batch() -> None:
    sel = selection(readmit_after=100)
    stream = SelectingStream(TaskStream(tasks(8), 4, 0, False), sel)
    run(stream, range(2), {f"t-{i}" for i in range(8)})  # every task solved
    batch = stream.batch(2)
    assert [t.task_id for t in batch] == ["t-0", "t-1", "t-2", "t-3"]  # explored at step 0
    assert stream.drawn_metrics(2)["tasks/readmitted_early"] == 4


def test_a_restored_state_draws_what_the_run_would_have() -> None:
    solved = {f"t-{i}" for i in range(0, 20, 3)}
    whole = SelectingStream(TaskStream(tasks(20), 4, 1, True), selection(readmit_after=7))
    straight = run(whole, range(15), solved)

    first = SelectingStream(TaskStream(tasks(20), 4, 1, True), selection(readmit_after=7))
    head = run(first, range(6), solved)
    first.batch(6)  # a rollout started ahead: the checkpoint keeps the position before it
    state = first.selection.state_dict(6)
    second = SelectingStream(TaskStream(tasks(20), 4, 1, True), selection(readmit_after=7))
    second.selection.load_state_dict(state)
    assert head + run(second, range(6, 15), solved) == straight


def test_a_mixture_shares_one_history_and_saves_every_streams_position() -> None:
    sel = selection(readmit_after=100)
    a = SelectingStream(TaskStream(tasks(8, "a"), 2, 0, True), sel)
    b = SelectingStream(TaskStream(tasks(8, "b"), 2, 1, True), sel)
    mix = MixtureStream([a, b])
    assert mix.selection is sel
    for step in range(6):
        solve(sel, mix.batch(step), step, {t.task_id for t in a.tasks})
    assert sel.metrics(5)["tasks/pool_easy"] == 8
    assert len(sel.state_dict(6)["streams"]) == 2
    assert TaskStream(tasks(8), 2, 0, True).selection is None


def test_dynamic_samplings_extra_rounds_draw_open_tasks() -> None:
    sel = selection(readmit_after=100)
    stream = SelectingStream(TaskStream(tasks(12), 4, 0, True), sel)
    easy = {f"t-{i}" for i in range(6)}
    run(stream, range(3), easy)
    extra = stream.extra(3, 1)
    assert not {t.task_id for t in extra} & easy and extra == stream.extra(3, 1)


def test_the_curriculum_opens_the_easiest_first_and_all_after_its_ramp() -> None:
    cfg = TaskSelectionConfig()
    cfg.curriculum.order, cfg.curriculum.column = "column", "level"
    cfg.curriculum.start_fraction, cfg.curriculum.ramp_steps = 0.25, 4
    sel = TaskSelection(cfg, "k")
    stream = SelectingStream(TaskStream(tasks(16), 2, 0, True), sel)
    assert {t.task_id for t in stream.batch(0)} <= {f"t-{i}" for i in range(12, 16)}  # levels 1..4
    assert stream.drawn_metrics(0)["tasks/pool_closed"] == 12 and stream.drawn_metrics(0)["tasks/pool_open"] == 4
    assert sel.opened(stream.tasks, 4, 2) is None
    by_history = TaskSelectionConfig()
    by_history.curriculum.order = "history"
    h = TaskSelection(by_history, "k")
    t = tasks(4)
    h.record([exp("t-3", 1.0)], 0)
    h.record([exp("t-0", 0.0)], 0)
    assert h.opened(t, 0, 1) == [False, False, False, True]  # solved first, then the unseen, the failed last
    assert h.opened(t, 0, 1, candidates=[0, 1, 2]) == [False, True, False, False]  # among those the filter leaves


def test_the_curriculum_ranks_only_the_tasks_the_filter_leaves_open() -> None:
    cfg = TaskSelectionConfig()
    cfg.difficulty_filter.enable, cfg.difficulty_filter.readmit_after = True, 100
    cfg.curriculum.order, cfg.curriculum.start_fraction, cfg.curriculum.ramp_steps = "history", 0.5, 100
    sel = TaskSelection(cfg, "k")
    stream = SelectingStream(TaskStream(tasks(16), 2, 0, True), sel)
    solved = {f"t-{i}" for i in range(8)}
    run(stream, range(8), solved)  # every task once: half always solved, half at pass rate 0.5
    counts = stream.drawn_metrics(8) if stream.batch(8) else {}
    # the solved half is filtered; the curriculum opens ceil(8 x (0.5 + 0.5 x 8 / 100)) = 5 of the other 8
    assert counts["tasks/pool_easy"] == 8 and counts["tasks/pool_open"] == 5 and counts["tasks/pool_closed"] == 3
    assert "tasks/readmitted_early" not in counts


def test_a_curriculum_column_without_numbers_is_named() -> None:
    cfg = TaskSelectionConfig()
    cfg.curriculum.order, cfg.curriculum.column = "column", "level"
    bad = tasks(2)
    bad[1].metadata["level"] = "hard"
    with pytest.raises(ValueError, match=r"task_selection\.curriculum\.column: task t-1 .* has 'hard' in column 'level'"):
        TaskSelection(cfg, "buffer.explorer_input.task_selection").check_column(bad, "buffer.explorer_input.taskset")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["buffer.explorer_input.task_selection.curriculum.order=column"], r"curriculum\.column: order column ranks the tasks by a numeric column"),
        (["buffer.explorer_input.task_selection.curriculum.column=level"], r"curriculum\.column 'level' is read by order column only; got order none"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "buffer.explorer_input.task_selection.difficulty_filter.too_easy=null", "buffer.explorer_input.task_selection.difficulty_filter.too_hard=null"], r"too_easy and too_hard are both null"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "buffer.explorer_input.task_selection.difficulty_filter.too_hard=0.6", "buffer.explorer_input.task_selection.difficulty_filter.too_easy=0.5"], r"too_hard \(0\.6\) must be below too_easy \(0\.5\)"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "algorithm.algorithm_type=sft", "mode=train"], r"task_selection chooses the tasks an RL stage explores; algorithm\.algorithm_type sft trains on the taskset's own responses"),
        (["buffer.explorer_input.task_selection.difficulty_filter.keep_probability=1.0"], r"keep_probability must be < 1"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "buffer.explorer_input.task_selection.difficulty_filter.refill=false", "mode=explore", "explorer.over_rollout.ratio=0.25"], r"difficulty_filter\.refill false makes each trainer step one explore step's tasks; the task scheduler .* turn it off, or keep refill true$"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "buffer.explorer_input.task_selection.difficulty_filter.refill=false", "synchronizer.asynchronous=true", "algorithm.algorithm_type=dapo"], r"difficulty_filter\.refill false explores fewer tasks a step, and algorithm\.dynamic_sampling refills a step to buffer\.batch_size groups: use one of them$"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "buffer.explorer_input.task_selection.difficulty_filter.refill=false", "mode=train", "buffer.train_batch_size=4"], r"difficulty_filter\.refill false gives a step with fewer open tasks fewer optimizer updates, and buffer\.train_batch_size 4 \(below a step's \d+ rollouts\)"),
        (["buffer.explorer_input.task_selection.difficulty_filter.enable=true", "buffer.explorer_input.task_selection.difficulty_filter.refill=false", "synchronizer.asynchronous=true", "buffer.trainer_input.experience_buffer.replay_buffer.enable=true"], r"difficulty_filter\.refill false keeps each trainer step to one explore step's places; the replay buffer .* turn one of them off$"),
        (["buffer.explorer_input.task_selection.curriculum.order=column", "buffer.explorer_input.task_selection.curriculum.column=answer"], r"curriculum\.column 'answer' is buffer\.explorer_input\.taskset's own"),
        (["buffer.explorer_input.task_selection.curriculum.order=hardest"], r"curriculum\.order must be one of none, history, column; got 'hardest'"),
    ],
)  # fmt: skip
def test_bad_task_selection_settings_are_refused_in_one_line(tmp_path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, *overrides)


@pytest.mark.parametrize("shape", [["mode=explore"], ["mode=train"], ["synchronizer.asynchronous=true"], []])
def test_refill_false_is_taken_in_every_run_shape(tmp_path, shape: list[str]) -> None:
    """Lock-step, either launch of a decoupled run, asynchronous both: an explorer that feeds a
    buffer puts places for the skipped tasks (runtime/explore_loop.py), so no shape refuses it."""
    f = "buffer.explorer_input.task_selection.difficulty_filter"
    cfg = resolve(tmp_path, f"{f}.enable=true", f"{f}.refill=false", *shape)
    assert cfg.buffer.explorer_input.task_selection.difficulty_filter.refill is False


def test_a_curriculum_column_every_row_must_fill_is_checked_before_the_run(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^buffer\.explorer_input\.task_selection\.curriculum\.column: .* row 1 has no number in column 'level'"):
        resolve(tmp_path, "buffer.explorer_input.task_selection.curriculum.order=column", "buffer.explorer_input.task_selection.curriculum.column=level")
