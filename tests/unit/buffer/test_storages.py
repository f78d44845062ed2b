"""Every storage keeps the ExperienceBuffer contract: groups whole and in order, each taken once,
a step asked again gives the same groups (a restarted trainer), `exhausted` once every writer
finished, a one-line error when a step waits too long, and every field of an experience back as
it went in."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from rlcore.buffer.base import BufferError, BufferTimeout, ExperienceBuffer
from rlcore.buffer.memory import MemoryBuffer

from .storages import STORAGES, group, open_storage, served_queue


@pytest.fixture(params=STORAGES)
def storage(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[str, str]]:
    kind = request.param
    if kind == "queue":
        with served_queue() as address:
            yield kind, address
    elif kind == "sql":
        yield kind, f"sqlite:///{tmp_path}/buffer.db"
    else:
        yield kind, str(tmp_path / "buffer")


def _open(
    storage: tuple[str, str], memory: dict[str, MemoryBuffer], writer: str | None = None
) -> ExperienceBuffer:
    kind, where = storage
    if kind == "memory":  # one store, several handles: the same object
        return memory.setdefault("store", MemoryBuffer("exps"))
    return open_storage(kind, where, writer)


def test_groups_come_back_whole_in_order_once_with_every_field(storage) -> None:
    memory: dict[str, MemoryBuffer] = {}
    writer, reader = _open(storage, memory, "w1"), _open(storage, memory)
    written = [group(f"t{i}", n=2 + i % 3, version=i) for i in range(7)]
    writer.put(written[:3])
    writer.put(written[3:])
    first = reader.take(0, 4, timeout_s=5)
    second = reader.take(1, 2, timeout_s=5)
    assert not first.exhausted and not second.exhausted
    assert first.groups + second.groups == written[:6]  # whole, in order, every field equal
    stats = reader.stats()
    assert (stats.groups_written, stats.experiences_written) == (7, sum(len(g) for g in written))
    assert (stats.groups_taken, stats.available, stats.steps_taken) == (6, 1, 2)
    writer.finish()
    last = reader.take(2, 4, timeout_s=5)
    assert last.groups == written[6:] and last.exhausted
    writer.close()
    reader.close()


def test_a_step_asked_again_gives_the_same_groups(storage) -> None:
    memory: dict[str, MemoryBuffer] = {}
    writer = _open(storage, memory, "w1")
    writer.put([group(f"t{i}") for i in range(6)])
    reader = _open(storage, memory)
    step0 = reader.take(0, 2, timeout_s=5).groups
    step1 = reader.take(1, 2, timeout_s=5).groups
    reader.close()
    again = _open(storage, memory)  # a trainer restarted from its checkpoint after step 0
    assert again.take(1, 2, timeout_s=5).groups == step1
    assert again.take(0, 2, timeout_s=5).groups == step0
    step2 = again.take(2, 2, timeout_s=5).groups
    assert [g[0].group_id for g in step2] == ["t4", "t5"]
    with pytest.raises(BufferError, match="asks for step 5, but the buffer has taken 3 step"):
        again.take(5, 2, timeout_s=1)
    again.close()
    writer.close()


def test_a_step_that_waits_too_long_says_what_came(storage) -> None:
    memory: dict[str, MemoryBuffer] = {}
    writer = _open(storage, memory, "w1")
    writer.put([group("t0")])
    reader = _open(storage, memory)
    with pytest.raises(
        BufferTimeout, match=r"step 0 waited 0.5 s for 3 experience groups and 1 came.*max_wait_s"
    ):
        reader.take(0, 3, timeout_s=0.5)
    writer.close()
    reader.close()


def test_file_reads_no_line_still_being_written(tmp_path) -> None:
    from rlcore.buffer.file import FileBuffer

    folder = str(tmp_path / "b")
    writer = FileBuffer("exps", folder, "w1")
    writer.put([group("t0")])
    line = json.dumps({"t": 1e12, "group": [{"v": 1}]})
    with open(os.path.join(folder, "writers", "w2.jsonl"), "w") as f:  # a writer halfway through a line
        f.write(line[: len(line) // 2])
    reader = FileBuffer("exps", folder)
    assert reader.stats().groups_written == 1
    assert [g[0].group_id for g in reader.take(0, 1, timeout_s=1).groups] == ["t0"]
    with pytest.raises(BufferTimeout):
        reader.take(1, 1, timeout_s=0.3)
    writer.close()
    reader.close()


def test_file_refuses_a_second_reader(tmp_path) -> None:
    from rlcore.buffer.file import FileBuffer

    folder = str(tmp_path / "b")
    FileBuffer("exps", folder, "w1").put([group("t0"), group("t1")])
    first = FileBuffer("exps", folder)
    first.take(0, 1, timeout_s=1)
    with pytest.raises(BufferError, match="another trainer reads this buffer"):
        FileBuffer("exps", folder).take(1, 1, timeout_s=1)
    first.close()


def test_a_record_of_another_schema_version_is_refused(tmp_path) -> None:
    from rlcore.buffer.file import FileBuffer

    folder = str(tmp_path / "b")
    os.makedirs(os.path.join(folder, "writers"))
    record = {"v": 99, "prompt_token_ids": [1]}
    with open(os.path.join(folder, "writers", "w1.jsonl"), "w") as f:
        f.write(json.dumps({"t": 1.0, "group": [record]}) + "\n")
    with pytest.raises(BufferError, match="schema version 99; this rlcore reads version 1"):
        FileBuffer("exps", folder).take(0, 1, timeout_s=1)


def test_sql_names_a_database_it_cannot_open(tmp_path) -> None:
    from rlcore.buffer.sql import SqlBuffer

    with pytest.raises(BufferError, match=r"experience buffer 'exps' \(sql .*\): cannot open the database"):
        SqlBuffer("exps", f"sqlite:///{tmp_path}/missing/folder/b.db")
