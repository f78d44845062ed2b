"""The sql storage's one reader: a lease, a row of rlcore_buffer_readers per buffer holding the
reader's id (host/pid namespace:pid:nonce) and when it last renewed it.

A trainer's first take leases the buffer, and a thread renews the lease every RENEW_S. A second
reader is refused in one line while the lease is renewed (at once when its holder is a live process
of this host), and takes it over once it lapsed (LEASE_S after its last renewal: a reader that
died) or at once when its holder ran on this host in a process that is gone. The same on SQLite and
PostgreSQL (plain rows, no advisory lock). A step is recorded only in a transaction that renews the
lease (`renewal`), so a reader whose lease was taken over records nothing more.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from .base import POLL_S, BufferError

RENEW_S = 5.0
"""How often the reader renews its lease."""
LEASE_S = 30.0
"""A reader's lease lapses this long after its last renewal (its trainer died); the clocks of the
hosts involved must agree to well within it."""

log = logging.getLogger(__name__)


class ReaderLease:
    def __init__(self, sa: Any, engine: Any, table: Any, buffer: str, describe: str):
        self.sa, self.engine, self.table, self.buffer, self.describe = sa, engine, table, buffer, describe
        self.reader: str | None = None
        """This handle's id while it holds the lease."""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lost = False

    def hold(self) -> None:
        """Become the buffer's one reader, or stop in one line naming the one that is."""
        if self.reader is not None:
            if self._lost:
                raise BufferError(self.lost())
            return
        me = f"{_here()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        seen = None
        while (holder := self._try(me)) is not None:
            if (seen is not None and holder != seen) or _alive_here(holder[0]):  # it renews: it lives
                raise BufferError(
                    f"{self.describe}: another trainer reads this buffer (reader {holder[0]}, its lease in table "
                    f"rlcore_buffer_readers renewed {time.time() - holder[1]:.0f} s ago); one reader per buffer: stop "
                    f"that trainer first (a trainer that died gives the lease up {LEASE_S:g} s after its last renewal)"
                )
            seen = holder
            time.sleep(POLL_S)
        self.reader = me
        self._renewer = threading.Thread(target=self._renew, name="rlcore-buffer-lease", daemon=True)
        self._renewer.start()

    def _try(self, me: str) -> tuple[str, float] | None:
        """Take the lease (None), or the (reader, renewed at) that holds it."""
        mine = self.table.c.buffer == self.buffer
        while True:
            now = time.time()
            with self.engine.connect() as c:
                row = c.execute(
                    self.sa.select(self.table.c.reader, self.table.c.renewed_at).where(mine)
                ).first()
            try:
                with self.engine.begin() as c:
                    if row is None:
                        c.execute(self.table.insert().values(buffer=self.buffer, reader=me, renewed_at=now))
                        return None
                    holder, renewed = str(row[0]), float(row[1])
                    if now - renewed < LEASE_S and not _died_here(holder):
                        return holder, renewed
                    taken = c.execute(  # only if no other reader took it over meanwhile
                        self.table.update()
                        .where(mine & (self.table.c.reader == holder))
                        .values(reader=me, renewed_at=now)
                    ).rowcount
            except self.sa.exc.IntegrityError:  # another reader inserted it first: look again
                continue
            if taken:
                why = (
                    "its process is gone"
                    if now - renewed < LEASE_S
                    else f"not renewed for {now - renewed:.0f} s"
                )
                log.warning(
                    "%s: took the reader's lease over from %s (%s: a trainer that died)",
                    self.describe,
                    holder,
                    why,
                )
                return None

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                with self.engine.begin() as c:
                    held = c.execute(self.renewal()).rowcount
            except self.sa.exc.DBAPIError:  # a busy or full database: renewed next time (a claim checks)
                continue
            if not held:
                self._lost = True
                return

    def renewal(self) -> Any:
        """The statement that renews the lease: it changes no row once another reader took it over."""
        mine = (self.table.c.buffer == self.buffer) & (self.table.c.reader == self.reader)
        return self.table.update().where(mine).values(renewed_at=time.time())

    def lost(self) -> str:
        return (
            f"{self.describe}: another reader took this trainer's lease over (table rlcore_buffer_readers): it was "
            f"not renewed for {LEASE_S:g} s (a database that stopped answering, a host clock off?); one reader per "
            "buffer: resume this trainer once the other stopped"
        )

    def release(self) -> None:
        """Give the lease up: a resumed trainer takes it at once."""
        if self._renewer is None:
            return
        self._stop.set()
        self._renewer.join()
        self._renewer = None
        mine = (self.table.c.buffer == self.buffer) & (self.table.c.reader == self.reader)
        try:
            with self.engine.begin() as c:
                c.execute(self.table.delete().where(mine))
        except self.sa.exc.DBAPIError:
            pass  # it lapses
        self.reader = None


def _here() -> str:
    """This host and pid namespace: where a reader's pid means a process (containers on one host
    may share its name)."""
    try:
        return f"{socket.gethostname()}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return socket.gethostname()


def _died_here(reader: str) -> bool:
    """Reader `reader` ran on this host, in a process that is gone."""
    host, pid, _ = reader.rsplit(":", 2)
    if host != _here():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        return False
    return False


def _alive_here(reader: str) -> bool:
    host, _, _ = reader.rsplit(":", 2)
    return host == _here() and not _died_here(reader)
