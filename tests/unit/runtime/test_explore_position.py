"""The explorer's position against the buffer (runtime/explore_position.py): a put that failed, or
whose position was not saved after it, resumes where the buffer says: after the put when it holds
the put's groups, before it (the step explored again) when it holds none; part of a put stops in
one line. A position the disk refuses is one line naming the file and the fix."""

from __future__ import annotations

import json
import os

import pytest

from rlcore.buffer.base import BufferError
from rlcore.buffer.file import FileBuffer
from rlcore.runtime.explore_position import PUTTING, begin_put, end_put, resume_position, save_position
from tests.unit.buffer.full_disk import fill, small_disk
from tests.unit.buffer.storages import group


def _position(step: int, put: dict[str, int]) -> dict:
    return {"explore_step": step, "policy_version": 0, "put": put}


def _setup(tmp_path) -> tuple[FileBuffer, str, dict]:
    """A writer that put 2 groups (its position saved), then began a put of 2 more."""
    buffer = FileBuffer("exps", str(tmp_path / "b"), "w1")
    state_file = str(tmp_path / "explorer_state.json")
    buffer.put([group("t0"), group("t1")])
    saved = _position(1, {"w1": 2})
    save_position(state_file, saved)
    begin_put(state_file, _position(2, {"w1": 4}))
    return buffer, state_file, saved


def test_a_put_that_did_not_land_is_explored_again(tmp_path) -> None:
    buffer, state_file, saved = _setup(tmp_path)
    assert resume_position(buffer, saved, state_file) == saved
    assert not os.path.exists(tmp_path / PUTTING)
    assert resume_position(buffer, saved, state_file) == saved  # nothing left to settle


def test_a_put_that_landed_before_its_position_was_saved_is_not_put_again(tmp_path) -> None:
    buffer, state_file, saved = _setup(tmp_path)
    buffer.put([group("t2"), group("t3")])  # it landed; the save after it failed
    assert resume_position(buffer, saved, state_file) == _position(2, {"w1": 4})
    with open(state_file) as f:
        assert json.load(f) == _position(2, {"w1": 4})
    assert not os.path.exists(tmp_path / PUTTING)


def test_a_first_put_that_failed_resumes_from_the_start(tmp_path) -> None:
    buffer = FileBuffer("exps", str(tmp_path / "b"), "w1")
    state_file = str(tmp_path / "explorer_state.json")
    begin_put(state_file, _position(1, {"w1": 2}))
    assert resume_position(buffer, None, state_file) is None
    begin_put(state_file, _position(1, {"w1": 2}))
    end_put(state_file)  # saved: nothing to settle
    assert resume_position(buffer, None, state_file) is None


def test_part_of_a_put_stops_in_one_line(tmp_path) -> None:
    buffer, state_file, saved = _setup(tmp_path)
    buffer.put([group("t2")])  # a storage that kept one group of the two (no storage of rlcore does)
    with pytest.raises(BufferError, match=r"it holds 1 of the 2 groups writer w1 put in explore step 1 \("):
        resume_position(buffer, saved, state_file)


def test_a_storage_that_cannot_count_puts_again(tmp_path) -> None:
    class Uncounted:
        def groups_by_writer(self) -> None:
            return None

        def describe(self) -> str:
            return "queue"

    state_file = str(tmp_path / "explorer_state.json")
    saved = _position(1, {"w1": 2})
    begin_put(state_file, _position(2, {"w1": 4}))
    assert resume_position(Uncounted(), saved, state_file) == saved


def test_a_position_the_full_disk_refuses_is_one_line(tmp_path) -> None:
    with small_disk(str(tmp_path / "disk"), 64) as disk:
        filler = fill(disk)
        path = os.path.join(disk, "explorer_state.json")
        with pytest.raises(RuntimeError) as e:
            save_position(path, {"explore_step": 1, "running": ["x" * 10000]})
        assert str(e.value).startswith(f"the explorer's position could not be saved in {path}: [Errno 28]")
        assert str(e.value).endswith(
            "free space there, then resume the explore launch with continue_from_checkpoint=true"
        )
        assert os.listdir(disk) == [os.path.basename(filler)]  # no temporary file left
        os.remove(filler)
        save_position(path, {"explore_step": 1})
        with open(path) as f:
            assert json.load(f) == {"explore_step": 1}


def test_the_position_carries_the_task_history_and_a_position_without_one_is_refused(tmp_path) -> None:
    import threading
    from types import SimpleNamespace

    from rlcore.core.config.schema import TaskSelectionConfig
    from rlcore.core.data.task_selection import SelectingStream, TaskSelection
    from rlcore.core.data.taskset import TaskStream
    from rlcore.core.types import Task
    from rlcore.runtime.explore_position import ExplorePosition

    def selection() -> TaskSelection:
        cfg = TaskSelectionConfig()
        cfg.difficulty_filter.enable = True
        sel = TaskSelection(cfg, "k")
        SelectingStream(TaskStream([Task(task_id=f"t{i}", source="t", prompt="p") for i in range(4)], 2, 0, True), sel)
        return sel

    buffer = FileBuffer("exps", str(tmp_path / "b"), "w1")
    sel = selection()
    sel.streams[0].batch(0)
    sel.record([SimpleNamespace(group_id="t0", reward=1.0, episode_id="")], 0)
    position = ExplorePosition(str(tmp_path / "explorer_state.json"), 0, "rl", sel)
    position.record(buffer, [group("t0")], None, 0, threading.Lock())
    again = ExplorePosition(position.state_file, 0, "rl", selection())
    again.resume(buffer)
    assert again.step == 1 and again.selection.state_dict(1) == sel.state_dict(1)
    plain = ExplorePosition(str(tmp_path / "plain.json"), 0, "rl")
    plain.record(buffer, [], None, 0, threading.Lock())
    with pytest.raises(ValueError, match=r"plain\.json: the explorer's position was saved without buffer\.explorer_input\.task_selection"):
        ExplorePosition(plain.state_file, 0, "rl", selection()).resume(buffer)
