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
from rlcore.core.types import is_skipped, skipped_task

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


def test_a_skipped_tasks_place_comes_back_as_a_place(storage) -> None:
    """difficulty_filter.refill false in a decoupled run: the explorer puts a place (no tokens) for
    each task its filter skipped beside its groups; every storage (the queue's gRPC wire included)
    gives it back in its slot, still a place, for the trainer to count and drop."""
    memory: dict[str, MemoryBuffer] = {}
    writer, reader = _open(storage, memory, "w1"), _open(storage, memory)
    written = [group("t0"), skipped_task("main:skipped:3:0", 2), group("t1"), skipped_task("main:skipped:3:1", 2)]
    writer.put(written)
    taken = reader.take(0, 4, timeout_s=5).groups
    assert taken == written and [is_skipped(g) for g in taken] == [False, True, False, True]
    writer.close()
    reader.close()


def test_dpo_pairs_come_back_as_the_pairs_a_trainer_reads(storage) -> None:
    """algorithm.dpo.pairs buffer: an explorer's (chosen, rejected) pairs through every storage are
    DPO's sequences, chosen then rejected, as sampled (loss masks kept)."""
    from rlcore.core.algorithms.dpo import best_and_worst
    from rlcore.runtime.taskset_rows import explored_pairs

    memory: dict[str, MemoryBuffer] = {}
    writer, reader = _open(storage, memory, "w1"), _open(storage, memory)
    pairs = [best_and_worst(group(f"t{i}", n=3)) for i in range(3)]
    writer.put(pairs)
    taken = reader.take(0, 3, timeout_s=5)
    seqs = explored_pairs([e for g in taken.groups for e in g])
    assert [s.response_token_ids for s in seqs] == [[4, 7, 6], [4, 5, 6]] * 3
    assert all(s.loss_mask == [1.0, 0.0, 1.0] for s in seqs)
    with pytest.raises(ValueError, match=r"^the experience buffer holds groups that are not \(chosen, rejected\) pairs"):
        explored_pairs(group("rl", n=3))  # an RL explorer's group
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


def test_file_names_a_damaged_line_and_passes_over_one_already_trained(tmp_path, caplog) -> None:
    """Bytes overwritten inside lines (a disk, a hand): a line a step already took is passed over
    with a warning when a resumed trainer opens the buffer; one not taken yet stops the step that
    needs it with one line naming the file, the line and the writer, never read as data."""
    from rlcore.buffer.file import FileBuffer

    folder = str(tmp_path / "b")
    writer = FileBuffer("exps", folder, "w1")
    writer.put([group(f"t{i}") for i in range(4)])
    reader = FileBuffer("exps", folder)
    assert [g[0].group_id for g in reader.take(0, 1, timeout_s=1).groups] == ["t0"]
    reader.close()

    path = os.path.join(folder, "writers", "w1.jsonl")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[0] = lines[0].replace(b'"reward":1.0', b'"reward":9.0')  # still JSON: its checksum tells
    lines[2] = lines[2][:100] + b"\x00" * 16 + lines[2][116:]  # no longer JSON
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))

    resumed = FileBuffer("exps", folder)
    with caplog.at_level("WARNING", logger="rlcore.buffer.file"):
        assert [g[0].group_id for g in resumed.take(1, 1, timeout_s=1).groups] == ["t1"]
    assert "line 1 of" in caplog.text and "does not match its checksum; step 0 took it already: passed over" in caplog.text
    with pytest.raises(BufferError) as e:
        resumed.take(2, 1, timeout_s=1)
    assert f"line 3 of {path} (writer w1) is damaged: it is not a readable record" in str(e.value)
    assert "\n" not in str(e.value) and resumed.stats().steps_taken == 2  # the failed step took nothing
    writer.close()
    resumed.close()


def test_a_resumed_explorer_refuses_a_buffer_that_lost_groups_it_acknowledged(tmp_path) -> None:
    """SQLite drops WAL frames past a damaged one without a word: committed groups vanish. The
    explorer's state counts what each of its writers put; resuming, it checks the storage still
    holds them, and stops in one line naming the writer instead of exploring on past the loss."""
    import shutil

    from rlcore.buffer.file import FileBuffer
    from rlcore.buffer.sql import SqlBuffer
    from rlcore.runtime.explore_position import check_buffer_holds

    live, copy = tmp_path / "live", tmp_path / "copy"
    live.mkdir()
    copy.mkdir()
    writer = SqlBuffer("exps", f"sqlite:///{live}/buffer.db", "w1")
    for i in range(3):  # three transactions, each its own frames in the write-ahead log
        writer.put([group(f"t{i}")])
        if i == 0:
            second = (live / "buffer.db-wal").stat().st_size + 100  # inside the second put's first frame
    put = {"w1": 3}
    assert writer.groups_by_writer() == put
    check_buffer_holds(writer, put, "state.json")
    for name in ("buffer.db", "buffer.db-wal"):  # the files as a crash leaves them
        shutil.copy(live / name, copy / name)
    wal = (copy / "buffer.db-wal").read_bytes()
    flipped = bytes(b ^ 0xFF for b in wal[second : second + 64])  # changed whatever they held
    (copy / "buffer.db-wal").write_bytes(wal[:second] + flipped + wal[second + 64 :])
    damaged = SqlBuffer("exps", f"sqlite:///{copy}/buffer.db", "w2")
    assert (damaged.groups_by_writer() or {}).get("w1", 0) < 3  # SQLite said nothing
    with pytest.raises(BufferError, match=r"holds [0-2] of the 3 groups writer w1 put before this explorer's checkpoint \(state.json\)"):
        check_buffer_holds(damaged, put, "state.json")
    writer.close()
    damaged.close()

    folder = str(tmp_path / "file")
    files = FileBuffer("exps", folder, "w1")
    files.put([group("t0"), group("t1")])
    assert files.groups_by_writer() == {"w1": 2}
    with pytest.raises(BufferError, match="holds 2 of the 5 groups writer w1 put"):
        check_buffer_holds(files, {"w1": 5}, "state.json")
    files.close()


def test_sql_says_a_held_lock_in_one_line_naming_the_database(tmp_path, monkeypatch) -> None:
    """Another process holds the SQLite file's write lock past the wait: one line naming the buffer
    and its database, not SQLAlchemy's text with the statement and the records."""
    import sqlite3

    from rlcore.buffer import sql

    monkeypatch.setattr(sql, "LOCK_WAIT_S", 0.5)
    path = tmp_path / "buffer.db"
    buffer = sql.SqlBuffer("exps", f"sqlite:///{path}", "w1")
    buffer.put([group("t0")])
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(BufferError) as e:
        buffer.put([group("t1")])
    message = str(e.value)
    assert message.startswith(f"experience buffer 'exps' (sql sqlite:///{path}): put: database is locked (waited 0.5 s")
    assert "INSERT" not in message and "\n" not in message
    holder.rollback()
    buffer.put([group("t1")])  # the lock gone, it writes again
    assert buffer.groups_by_writer() == {"w1": 2}
    holder.close()
    buffer.close()


def test_sql_names_a_damaged_row_and_reads_rows_stored_before_checksums(tmp_path) -> None:
    """Each stored record is sealed with its checksum: a row changed in place (a disk, a hand) stops
    the step that needs it in one line naming the table, the row and the writer; a row stored
    without a checksum (an older rlcore) is read as it is."""
    import sqlite3

    from rlcore.buffer.sql import SqlBuffer

    path = tmp_path / "buffer.db"
    buffer = SqlBuffer("exps", f"sqlite:///{path}", "w1")
    buffer.put([group("t0"), group("t1"), group("t2")])
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, record FROM rlcore_experiences ORDER BY id").fetchall()
        old_style = rows[0][1].rsplit(',"c":"', 1)[0] + "}"  # t0's first row as stored before checksums
        db.execute("UPDATE rlcore_experiences SET record = ? WHERE id = ?", (old_style, rows[0][0]))
        damaged = rows[3][1].replace('"reward":0.0', '"reward":9.0')  # t1's first experience
        db.execute("UPDATE rlcore_experiences SET record = ? WHERE id = ?", (damaged, rows[3][0]))
    assert [g[0].group_id for g in buffer.take(0, 1, timeout_s=1).groups] == ["t0"]
    with pytest.raises(BufferError) as e:
        buffer.take(1, 1, timeout_s=1)
    assert f"row {rows[3][0]} of table rlcore_experiences (writer w1, group w1:2) is damaged: it does not match its checksum" in str(e.value)
    buffer.close()
