"""The sql storage: a database through SQLAlchemy, an SQLite file by default, or any URL SQLAlchemy
takes (postgresql+psycopg://user@host/db for PostgreSQL).

    rlcore_buffer_meta     the schema version of these tables
    rlcore_experiences     one row per experience: its group, writer, task, policy version, reward
                           and the whole record (records.py) as JSON, sealed with its XXH3-64
                           checksum (a damaged row is named, never read as data); a group's rows go
                           in in one transaction, so a reader sees all of a group or none of it
    rlcore_buffer_steps    the reader's ledger: which groups each step took, in order
    rlcore_buffer_writers  the writers, and whether they finished
    rlcore_buffer_readers  the one reader's lease: its id (host, pid) and when it last renewed it

Several buffers (`name`) can share a database. Unread groups are taken oldest first (by row id).

One reader per buffer: its first take leases the buffer (sql_lease.py); a second one is refused in
one line while the lease is renewed.

A write the database refuses (a full disk) is one line naming the buffer, its database and the fix;
a put is one transaction: all of its groups or none, and a resumed explorer counts which
(explore_position.py).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import xxhash

from .base import BufferError, BufferStats, Group, LedgerBuffer, write_failed
from .records import SCHEMA_VERSION, from_record, to_record
from .sql_lease import ReaderLease

TABLES_VERSION = "1"
LOCK_WAIT_S = 60
"""How long an SQLite connection waits for the file's lock (writers and the reader take turns)."""
RESUME = {"_put": "explore", "finish": "explore", "_recorded": "train", "_claim": "train"}
"""The calls whose failure stops a launch (a put and a step are each one transaction, undone
whole), by the launch to resume once the database answers again."""
SAID_AS = {"_recorded": "take", "_steps_taken": "take", "_progress": "take", "_claim": "take"}
"""The reader's calls are its take."""

F = TypeVar("F", bound=Callable[..., Any])


def _said_in_one_line(method: F) -> F:
    """A database error of `method` as one BufferError line naming the buffer and its database,
    never SQLAlchemy's text with the statement and its parameters (whole records)."""

    @functools.wraps(method)
    def wrapper(self: SqlBuffer, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except self.sa.exc.DBAPIError as e:
            reason = _first_line(e.orig) if e.orig is not None else _first_line(e)
            hint = (
                f" (waited {LOCK_WAIT_S} s for it: another process holds the database, a long transaction "
                "or a tool that opened it)" if "locked" in reason else ""
            )  # fmt: skip
            said = reason + hint
            if method.__name__ in RESUME:
                said = write_failed(said, RESUME[method.__name__])
            what = SAID_AS.get(method.__name__, method.__name__.strip("_"))
            raise BufferError(f"{self.describe()}: {what}: {said}") from None

    return wrapper  # type: ignore[return-value]


def _tables() -> Any:
    import sqlalchemy as sa

    md = sa.MetaData()
    sa.Table("rlcore_buffer_meta", md, sa.Column("key", sa.String(64), primary_key=True),
             sa.Column("value", sa.String(256), nullable=False))  # fmt: skip
    sa.Table(
        "rlcore_experiences", md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("buffer", sa.String(200), nullable=False),
        sa.Column("group_key", sa.String(300), nullable=False),
        sa.Column("writer", sa.String(200), nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("policy_version", sa.Integer, nullable=False),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("use_count", sa.Integer, nullable=False, default=0),
        sa.Index("rlcore_experiences_unread", "buffer", "use_count", "id"),
        sa.Index("rlcore_experiences_group", "buffer", "group_key"),
    )  # fmt: skip
    sa.Table(
        "rlcore_buffer_steps", md,
        sa.Column("buffer", sa.String(200), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("group_key", sa.String(300), nullable=False),
    )  # fmt: skip
    sa.Table(
        "rlcore_buffer_writers", md,
        sa.Column("buffer", sa.String(200), primary_key=True),
        sa.Column("writer", sa.String(200), primary_key=True),
        sa.Column("finished", sa.Boolean, nullable=False, default=False),
    )  # fmt: skip
    sa.Table(
        "rlcore_buffer_readers", md,
        sa.Column("buffer", sa.String(200), primary_key=True),
        sa.Column("reader", sa.String(300), nullable=False),
        sa.Column("renewed_at", sa.Float, nullable=False),
    )  # fmt: skip
    return md


class SqlBuffer(LedgerBuffer):
    storage_type = "sql"

    def __init__(self, name: str, url: str, writer: str | None = None):
        super().__init__(name, url, writer)
        try:
            import sqlalchemy as sa
        except ImportError:
            raise BufferError(
                f"{self.describe()}: the sql storage needs SQLAlchemy: pip install 'rlcore[sql]'"
            ) from None
        self.sa = sa
        connect_args: dict[str, Any] = {}
        if url.startswith("sqlite"):
            connect_args["timeout"] = LOCK_WAIT_S
        try:
            self.engine = sa.create_engine(url, connect_args=connect_args)
            if url.startswith("sqlite"):
                sa.event.listen(self.engine, "connect", _sqlite_wal)
            md = _tables()
            self.t = md.tables
            for attempt in range(3):  # processes opening a new database together race to create it
                try:
                    md.create_all(self.engine)
                    self._check_version()
                    break
                except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError):
                    if attempt == 2:
                        raise
                    time.sleep(0.2 * (attempt + 1))
        except BufferError:
            raise
        except Exception as e:  # a bad URL, a missing driver, a server that does not answer
            raise BufferError(f"{self.describe()}: cannot open the database: {_first_line(e)}") from None
        self._seq = 0
        self.lease = ReaderLease(sa, self.engine, self.t["rlcore_buffer_readers"], name, self.describe())

    def describe(self) -> str:
        where = (
            self.where
            if "@" not in self.where
            else self.where.split("://")[0] + "://..." + self.where.split("@")[-1]
        )
        return f"experience buffer '{self.name}' (sql {where})"

    def _check_version(self) -> None:
        meta = self.t["rlcore_buffer_meta"]
        with self.engine.begin() as c:
            row = c.execute(self.sa.select(meta.c.value).where(meta.c.key == "tables_version")).first()
            if row is None:
                c.execute(meta.insert().values(key="tables_version", value=TABLES_VERSION))
            elif row[0] != TABLES_VERSION:
                raise BufferError(
                    f"{self.describe()}: the database holds rlcore buffer tables of version {row[0]}; this "
                    f"rlcore writes version {TABLES_VERSION}: use another database"
                )

    # ------------------------------------------------------------------ writer side

    def _register(self, c: Any, finished: bool) -> None:
        writers = self.t["rlcore_buffer_writers"]
        key = (writers.c.buffer == self.name) & (writers.c.writer == self.writer)
        if c.execute(self.sa.select(writers.c.writer).where(key)).first() is None:
            c.execute(writers.insert().values(buffer=self.name, writer=self.writer, finished=finished))
        elif finished:
            c.execute(writers.update().where(key).values(finished=True))

    @_said_in_one_line
    def _put(self, groups: list[Group]) -> None:
        rows = []
        now = time.time()
        for g in groups:
            self._seq += 1
            key = f"{self.writer}:{self._seq}"
            for e in g:
                rows.append({
                    "buffer": self.name, "group_key": key, "writer": self.writer, "task_id": e.group_id,
                    "policy_version": e.policy_version, "reward": e.reward, "schema_version": SCHEMA_VERSION,
                    "record": sealed(json.dumps(to_record(e), separators=(",", ":"))), "created_at": now, "use_count": 0,
                })  # fmt: skip
        with self.engine.begin() as c:  # one transaction: every group whole, or none
            self._register(c, finished=False)
            c.execute(self.t["rlcore_experiences"].insert(), rows)

    @_said_in_one_line
    def finish(self) -> None:
        with self.engine.begin() as c:
            self._register(c, finished=True)

    # ------------------------------------------------------------------ reader side

    def _rows(self, c: Any, keys: list[str]) -> list[Group]:
        exps = self.t["rlcore_experiences"]
        found = c.execute(
            self.sa.select(exps.c.group_key, exps.c.record, exps.c.id, exps.c.writer)
            .where((exps.c.buffer == self.name) & exps.c.group_key.in_(keys))
            .order_by(exps.c.id)
        ).all()
        by_key: dict[str, Group] = {k: [] for k in keys}
        for key, record, row_id, writer in found:
            problem = unsealed_problem(record)
            if problem is not None:
                raise BufferError(
                    f"{self.describe()}: row {row_id} of table rlcore_experiences (writer {writer}, group {key}) is "
                    f"damaged: {problem}; the group was acknowledged to its writer and cannot be given back: restore "
                    "the database, or delete the group's rows to train without it"
                )
            by_key[key].append(from_record(json.loads(record), self.describe()))
        if any(not g for g in by_key.values()):
            raise BufferError(
                f"{self.describe()}: the ledger names groups whose rows are gone from the database"
            )
        return [by_key[k] for k in keys]

    @_said_in_one_line
    def _recorded(self, step: int) -> list[Group] | None:
        self.lease.hold()
        steps = self.t["rlcore_buffer_steps"]
        with self.engine.connect() as c:
            keys = (
                c.execute(
                    self.sa.select(steps.c.group_key)
                    .where((steps.c.buffer == self.name) & (steps.c.step == step))
                    .order_by(steps.c.position)
                )
                .scalars()
                .all()
            )
            if not keys:
                return None if step >= self._steps_taken_in(c) else []
            return self._rows(c, list(keys))

    def _steps_taken_in(self, c: Any) -> int:
        steps = self.t["rlcore_buffer_steps"]
        last = c.execute(
            self.sa.select(self.sa.func.max(steps.c.step)).where(steps.c.buffer == self.name)
        ).scalar()
        return 0 if last is None else int(last) + 1

    @_said_in_one_line
    def _steps_taken(self) -> int:
        with self.engine.connect() as c:
            return self._steps_taken_in(c)

    def _unread(self, c: Any, limit: int | None = None) -> list[str]:
        exps = self.t["rlcore_experiences"]
        query = (
            self.sa.select(exps.c.group_key)
            .where((exps.c.buffer == self.name) & (exps.c.use_count == 0))
            .group_by(exps.c.group_key)
            .order_by(self.sa.func.min(exps.c.id))
        )
        if limit is not None:
            query = query.limit(limit)
        return list(c.execute(query).scalars().all())

    @_said_in_one_line
    def _progress(self) -> tuple[int, int, int]:
        writers = self.t["rlcore_buffer_writers"]
        with self.engine.connect() as c:
            rows = (
                c.execute(self.sa.select(writers.c.finished).where(writers.c.buffer == self.name))
                .scalars()
                .all()
            )
            return len(self._unread(c)), len(rows), sum(1 for f in rows if f)

    @_said_in_one_line
    def _claim(self, step: int, num_groups: int) -> list[Group]:
        exps, steps = self.t["rlcore_experiences"], self.t["rlcore_buffer_steps"]
        with self.engine.begin() as c:
            if not c.execute(self.lease.renewal()).rowcount:
                raise BufferError(self.lease.lost())
            keys = self._unread(c, num_groups)
            if keys:
                c.execute(
                    steps.insert(),
                    [
                        {"buffer": self.name, "step": step, "position": i, "group_key": k}
                        for i, k in enumerate(keys)
                    ],
                )
                c.execute(
                    exps.update()
                    .where((exps.c.buffer == self.name) & exps.c.group_key.in_(keys))
                    .values(use_count=exps.c.use_count + 1)
                )
            return self._rows(c, keys) if keys else []

    @_said_in_one_line
    def groups_by_writer(self) -> dict[str, int] | None:
        sa, exps = self.sa, self.t["rlcore_experiences"]
        with self.engine.connect() as c:
            rows = c.execute(
                sa.select(exps.c.writer, sa.func.count(sa.distinct(exps.c.group_key)))
                .where(exps.c.buffer == self.name)
                .group_by(exps.c.writer)
            ).all()
        return {str(w): int(n) for w, n in rows}

    @_said_in_one_line
    def stats(self) -> BufferStats:
        sa, exps, steps = self.sa, self.t["rlcore_experiences"], self.t["rlcore_buffer_steps"]
        mine = exps.c.buffer == self.name
        with self.engine.connect() as c:
            groups, experiences = c.execute(
                sa.select(sa.func.count(sa.distinct(exps.c.group_key)), sa.func.count()).where(mine)
            ).one()
            taken_groups = c.execute(sa.select(sa.func.count()).where(steps.c.buffer == self.name)).scalar()
            taken_exps = c.execute(
                sa.select(sa.func.count())
                .select_from(
                    steps.join(
                        exps, (steps.c.group_key == exps.c.group_key) & (steps.c.buffer == exps.c.buffer)
                    )
                )
                .where(steps.c.buffer == self.name)
            ).scalar()
            available, writers, finished = len(self._unread(c)), 0, 0
            w = self.t["rlcore_buffer_writers"]
            flags = c.execute(sa.select(w.c.finished).where(w.c.buffer == self.name)).scalars().all()
            writers, finished = len(flags), sum(1 for f in flags if f)
            return BufferStats(
                groups_written=int(groups), experiences_written=int(experiences), groups_taken=int(taken_groups or 0),
                experiences_taken=int(taken_exps or 0), available=available, writers=writers,
                writers_finished=finished, steps_taken=self._steps_taken_in(c),
            )  # fmt: skip

    def close(self) -> None:
        self.lease.release()
        self.engine.dispose()


def sealed(record_json: str) -> str:
    """A stored record with its XXH3-64 checksum as its last key `c` (records.py's readers ignore it)."""
    return f'{record_json[:-1]},"c":"{xxhash.xxh3_64_hexdigest(record_json.encode())}"}}'


def unsealed_problem(stored: str) -> str | None:
    """What is wrong with a stored record (None: nothing; a record stored without `c` is taken as it is)."""
    body, sep, tail = stored.rpartition(',"c":"')
    if not sep:
        try:
            json.loads(stored)
        except ValueError as e:
            return f"it is not JSON ({e})"
        return None
    digest = tail.removesuffix('"}')
    if xxhash.xxh3_64_hexdigest((body + "}").encode()) != digest:
        return "it does not match its checksum"
    return None


def _sqlite_wal(dbapi_connection: Any, record: Any) -> None:
    """WAL: a reader does not wait for a writer's transaction, nor a writer for a reader."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
