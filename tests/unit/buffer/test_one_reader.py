"""One reader per buffer: the file storage's lock and the sql storage's lease refuse a second trainer
in one line; a dead reader's lease is taken over (at once when its process is gone from this host,
else once it lapsed), and a reader whose lease was taken over records no step. A trainer asking a
queue for a step it does not have is told what happened to the queue."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time

import pytest

from rlcore.buffer import sql_lease
from rlcore.buffer.base import BufferError
from rlcore.buffer.memory import MemoryBuffer
from rlcore.buffer.sql import SqlBuffer

from .storages import group, open_storage, served_queue


@pytest.mark.parametrize("kind", ["file", "sql"])
def test_a_second_reader_is_refused_in_one_line(kind: str, tmp_path) -> None:
    where = f"sqlite:///{tmp_path}/b.db" if kind == "sql" else str(tmp_path / "b")
    writer = open_storage(kind, where, "w1")
    writer.put([group(f"t{i}") for i in range(4)])
    first = open_storage(kind, where)
    assert [g[0].group_id for g in first.take(0, 2, timeout_s=1).groups] == ["t0", "t1"]
    second = open_storage(kind, where)
    start = time.monotonic()
    with pytest.raises(BufferError) as e:
        second.take(1, 2, timeout_s=1)
    message = str(e.value)
    assert time.monotonic() - start < 2 and "\n" not in message
    assert message.startswith(
        f"experience buffer 'exps' ({kind} {where}): another trainer reads this buffer ("
    )
    assert "one reader per buffer" in message
    if kind == "sql":
        assert f"(reader {sql_lease._here()}:" in message and "table rlcore_buffer_readers" in message
    first.close()  # gives the buffer up: a resumed trainer reads it at once
    resumed = open_storage(kind, where)
    assert [g[0].group_id for g in resumed.take(1, 2, timeout_s=1).groups] == ["t2", "t3"]
    assert [g[0].group_id for g in resumed.take(0, 2, timeout_s=1).groups] == ["t0", "t1"]
    for b in (second, resumed, writer):
        b.close()


def _lease(db: str, reader: str, renewed_at: float) -> None:
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM rlcore_buffer_readers")
        c.execute("INSERT INTO rlcore_buffer_readers VALUES ('exps', ?, ?)", (reader, renewed_at))


def test_sql_takes_over_the_lease_of_a_reader_that_died(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(sql_lease, "LEASE_S", 1.0)
    db = str(tmp_path / "b.db")
    writer = SqlBuffer("exps", f"sqlite:///{db}", "w1")
    writer.put([group(f"t{i}") for i in range(4)])
    gone = subprocess.Popen(["true"])
    gone.wait()
    cases = {  # the lease's holder -> how long the next reader waits for it
        f"{sql_lease._here()}:{gone.pid}:0": (0.0, 0.0, "its process is gone"),  # on this host
        "elsewhere:1:0": (5.0, 0.0, "not renewed for 5 s"),  # lapsed
        "elsewhere:2:0": (0.0, 1.0, "not renewed for 1 s"),  # lapses while the reader waits
    }
    for holder, (age_s, waits_s, why) in cases.items():
        _lease(db, holder, time.time() - age_s)
        reader = SqlBuffer("exps", f"sqlite:///{db}")
        start = time.monotonic()
        with caplog.at_level("WARNING", logger="rlcore.buffer.sql_lease"):
            assert [g[0].group_id for g in reader.take(0, 2, timeout_s=5).groups] == ["t0", "t1"]
        assert waits_s <= time.monotonic() - start < waits_s + 1.0, holder
        assert f"took the reader's lease over from {holder} ({why}: a trainer that died)" in caplog.text
        reader.close()
    writer.close()


def test_sql_refuses_a_reader_while_another_host_renews_the_lease(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sql_lease, "LEASE_S", 10.0)
    db = str(tmp_path / "b.db")
    writer = SqlBuffer("exps", f"sqlite:///{db}", "w1")
    writer.put([group("t0")])
    _lease(db, "elsewhere:7:0", time.time())
    stop = threading.Event()

    def renew() -> None:  # a live reader on another host
        while not stop.wait(0.1):
            with sqlite3.connect(db) as c:
                c.execute("UPDATE rlcore_buffer_readers SET renewed_at = ?", (time.time(),))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        start = time.monotonic()
        with pytest.raises(
            BufferError, match=r"another trainer reads this buffer \(reader elsewhere:7:0, its lease"
        ):
            SqlBuffer("exps", f"sqlite:///{db}").take(0, 1, timeout_s=5)
        assert time.monotonic() - start < 2  # not the lease's 10 s
    finally:
        stop.set()
        renewer.join()
    writer.close()


def test_sql_a_reader_renews_its_lease_and_records_nothing_once_it_was_taken_over(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(sql_lease, "RENEW_S", 0.1)
    db = str(tmp_path / "b.db")
    writer = SqlBuffer("exps", f"sqlite:///{db}", "w1")
    writer.put([group(f"t{i}") for i in range(4)])
    reader = SqlBuffer("exps", f"sqlite:///{db}")
    reader.take(0, 2, timeout_s=1)
    with sqlite3.connect(db) as c:
        first = c.execute("SELECT renewed_at FROM rlcore_buffer_readers").fetchone()[0]
    time.sleep(0.5)
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT renewed_at FROM rlcore_buffer_readers").fetchone()[0] > first
        c.execute("UPDATE rlcore_buffer_readers SET reader = 'elsewhere:3:0', renewed_at = ?", (time.time(),))
    with pytest.raises(BufferError, match="another reader took this trainer's lease over"):
        reader.take(1, 2, timeout_s=1)
    assert writer.stats().steps_taken == 1  # the step was not recorded
    reader.close()
    with sqlite3.connect(db) as c:  # the lease is the other reader's still
        assert c.execute("SELECT reader FROM rlcore_buffer_readers").fetchall() == [("elsewhere:3:0",)]
    writer.close()


QUEUE_LOST = (
    "but the buffer has taken 0 step(s): the queue lives in the memory of the launch that serves it, and "
    "restarting that launch lost its groups and ledger: the queue storage cannot resume a decoupled run; use "
    "buffer.trainer_input.experience_buffer.storage_type file or sql for a resumable decoupled run"
)


def test_a_restarted_queue_says_it_lost_its_ledger_and_what_to_use_instead() -> None:
    queue = MemoryBuffer("exps", where="the controller of run")
    queue.put([group("t0")])
    with pytest.raises(BufferError) as e:
        queue.take(3, 1, timeout_s=1)  # a trainer resumed at step 3 from a queue its launch served anew
    assert (
        str(e.value)
        == f"experience buffer 'exps' (queue the controller of run): the trainer asks for step 3, {QUEUE_LOST}"
    )
    with served_queue() as address:  # as a trainer sees it over gRPC
        client = open_storage("queue", address)
        with pytest.raises(BufferError) as e:
            client.take(3, 1, timeout_s=1)
        assert QUEUE_LOST in str(e.value) and "\n" not in str(e.value)
        client.close()


def test_a_file_or_sql_buffer_behind_the_trainer_blames_its_ledger(tmp_path) -> None:
    buffer = open_storage("file", str(tmp_path / "b"), "w1")
    buffer.put([group("t0")])
    with pytest.raises(BufferError) as e:
        buffer.take(2, 1, timeout_s=1)
    assert "did the storage lose its ledger's last steps" in str(e.value) and "another trainer" not in str(
        e.value
    )
    buffer.close()
