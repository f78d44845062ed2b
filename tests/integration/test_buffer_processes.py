"""The experience buffer across processes, for each storage: two explorer processes put groups while
a trainer process takes them; every group arrives whole, none twice, none lost (counted). The sql
storage also runs against a real PostgreSQL server that the test starts (skipped, with the reason,
where PostgreSQL is not installed), with its one-reader lease."""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.buffer.storages import group, open_storage, served_queue

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GROUPS_PER_WRITER = 40
SIZES = (2, 5, 8)


def _write(kind: str, where: str, writer: str, started: Any) -> None:
    buf = open_storage(kind, where, writer)
    for i in range(0, GROUPS_PER_WRITER, 4):  # several puts, of several groups each
        buf.put([group(f"{writer}/{j}", n=SIZES[j % 3], version=j) for j in range(i, i + 4)])
        if i == 0:  # a buffer knows its writers by their first put: both are known before either finishes
            started.wait(timeout=120)
        time.sleep(0.01)
    buf.finish()
    buf.close()


def _read(kind: str, where: str, out: mp.Queue) -> None:
    buf = open_storage(kind, where)
    taken, step = [], 0
    while True:
        got = buf.take(step, 6, timeout_s=60)
        taken += [(g[0].group_id, len(g), len({e.group_id for e in g})) for g in got.groups]
        step += 1
        if got.exhausted:
            break
    out.put((taken, step))
    buf.close()


def _exchange(kind: str, where: str) -> None:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    started = ctx.Barrier(2)
    procs = [ctx.Process(target=_write, args=(kind, where, w, started)) for w in ("w1", "w2")]
    procs.append(ctx.Process(target=_read, args=(kind, where, out)))
    for p in procs:
        p.start()
    deadline = time.monotonic() + 240
    while out.empty():
        assert time.monotonic() < deadline and all(p.exitcode in (None, 0) for p in procs), [
            p.exitcode for p in procs
        ]
        time.sleep(0.1)
    taken, steps = out.get()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ids = [t[0] for t in taken]
    assert len(ids) == 2 * GROUPS_PER_WRITER == len(set(ids))  # every group, once
    for task, size, tasks in taken:  # whole: every experience of the group, and only its
        assert size == SIZES[int(task.split("/")[1]) % 3] and tasks == 1, (task, size)
    for w in ("w1", "w2"):  # a writer's groups in the order it wrote them
        mine = [int(t.split("/")[1]) for t in ids if t.startswith(w)]
        assert mine == sorted(mine)
    stats = open_storage(kind, where).stats()
    assert stats.groups_written == stats.groups_taken == 2 * GROUPS_PER_WRITER and stats.available == 0
    assert stats.steps_taken == steps or kind == "sql"  # sql records no step that found nothing left


@pytest.mark.parametrize("kind", ["file", "sql", "queue"])
def test_explorers_and_a_trainer_in_processes_exchange_every_group_once(kind: str, tmp_path) -> None:
    if kind == "queue":
        with served_queue() as address:
            _exchange(kind, address)
    else:
        _exchange(kind, f"sqlite:///{tmp_path}/b.db" if kind == "sql" else str(tmp_path / "b"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def postgres() -> Iterator[str]:
    """A PostgreSQL server of its own (initdb + pg_ctl) on a free loopback port; its SQLAlchemy URL."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")) or [shutil.which("pg_ctl") or ""]
    if not bins[-1]:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    bindir = os.path.dirname(bins[-1])
    home = tempfile.mkdtemp(prefix="rlcore-pg-")  # outside pytest's root-only folders
    data = os.path.join(home, "pgdata")
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as user postgres
        if shutil.which("runuser") is None:
            pytest.skip("PostgreSQL refuses root, and runuser is missing to start it as user postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
    port = _free_port()
    subprocess.run([*as_user, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "rlcore"], check=True,
                   capture_output=True)  # fmt: skip
    log = os.path.join(home, "pg.log")
    subprocess.run(
        [*as_user, f"{bindir}/pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o",
         f"-p {port} -k {home} -c listen_addresses=127.0.0.1", "start"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield f"postgresql+psycopg://rlcore@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(home, ignore_errors=True)


def test_the_sql_storage_on_a_real_postgresql_server(postgres: str) -> None:
    from rlcore.buffer.base import BufferError

    _exchange("sql", postgres)
    # one reader: a second trainer is refused while the first holds the lease
    buf = open_storage("sql", postgres)
    first = [g[0].group_id for g in buf.take(0, 6, timeout_s=5).groups]
    with pytest.raises(BufferError, match="another trainer reads this buffer"):
        open_storage("sql", postgres).take(0, 6, timeout_s=5)
    buf.close()
    # a restarted trainer gets the steps it took again, from the server
    again = open_storage("sql", postgres)
    assert [g[0].group_id for g in again.take(0, 6, timeout_s=5).groups] == first
    again.close()
