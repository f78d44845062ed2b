"""The file storage: append-only JSONL in a folder, for explorers and a trainer that share a file
system.

    <path>/writers/<writer>.jsonl   each writer's groups, one line each ({"t": unix time, "c": XXH3-64
                                    of the group's JSON, "group": [...]}), a put's lines appended
                                    together and fsynced; every line of a put but its last says
                                    "m": 1 (more follow): a put is read once its last line is
                                    complete, so a reader sees all of a put or none of it
    <path>/writers/<writer>.done    the writer finished
    <path>/steps.jsonl              the reader's ledger: one line per step, the groups it took as
                                    [writer, line number] pairs
    <path>/reader.lock              held (flock) by the one reader

Unread groups are taken oldest first (by the time their line was written).

A put that fails (a full disk: any OSError) is cut from the file again and said in one line naming
the buffer, the file and the fix; its lines are never read even where the cut fails (its last line
is missing), and the writer cuts them before its next put. A resumed explorer counts what the
buffer holds of its last put (explore_position.py), so no group is lost or written twice. A step
the ledger cannot record fails the same way, the ledger left as it was.

A damaged line (not JSON, or its group no longer matching its checksum: a disk or a hand that
changed the file) is never read as data: a step that needs it stops with one line naming the file,
the line and the writer. One a step already took is named in a warning when the reader opens the
buffer and otherwise passed over: a resumed trainer takes again only the steps after its checkpoint,
so it stops the run only if its step is one of those. Lines written before checksums (no "c") are
read as they are.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
from typing import IO

import xxhash

from .base import BufferError, BufferStats, Group, LedgerBuffer, write_failed
from .records import from_record, group_to_json

log = logging.getLogger(__name__)

WRITERS = "writers"
STEPS = "steps.jsonl"
READER_LOCK = "reader.lock"


_GROUP = b',"group":'
_TIME = re.compile(rb'^\{"t":([0-9.eE+-]+),')
_MORE = re.compile(rb'\{"t":[0-9.eE+-]+,"c":"[0-9a-f]+","m":1,"group":')
"""A line its put's next lines follow."""


def checksum(group_json: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(group_json)


def line_of(t: float, group: Group, more: bool = False) -> str:
    """A writer's line for `group`, written at time `t`; `more`: its put's next lines follow."""
    text = group_to_json(group)
    mark = '"m":1,' if more else ""
    return f'{{"t":{t!r},"c":"{checksum(text.encode())}",{mark}"group":{text}}}\n'


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Lines:
    """One writer's file as the reader has read it so far."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.starts: list[int] = []
        """Byte offset of each complete line."""
        self.times: list[float] = []
        self.sizes: list[int] = []
        """Experiences in each group."""
        self.damaged: dict[int, str] = {}
        """Line index -> what is wrong with it."""

    def scan(self) -> list[int]:
        """Read the puts completed since the last scan (a put's lines once its last one is
        complete); the damaged lines among them."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        damaged: list[int] = []
        lines: list[tuple[int, bytes]] = []
        pos = done = 0
        while (end := data.find(b"\n", pos)) >= 0:
            lines.append((self.offset + pos, data[pos:end]))
            if not _MORE.match(data, pos):  # its put's last line: the put is whole
                damaged += [i for start, line in lines if (i := self._add(start, line)) is not None]
                lines, done = [], end + 1
            pos = end + 1
        self.offset += done
        return damaged

    def _add(self, start: int, line: bytes) -> int | None:
        """Take in the complete line at byte `start`; its index if it is damaged."""
        self.starts.append(start)
        problem = self._problem(line)
        if problem is None:
            record = json.loads(line)
            self.times.append(float(record["t"]))
            self.sizes.append(len(record["group"]))
            return None
        # kept in its place in time: its own time if readable, else its predecessor's
        index = len(self.times)
        self.damaged[index] = problem
        when = _TIME.match(line)
        self.times.append(float(when[1]) if when else (self.times[-1] if self.times else 0.0))
        self.sizes.append(0)
        return index

    @staticmethod
    def _problem(line: bytes) -> str | None:
        """What is wrong with a line, None when nothing is."""
        try:
            record = json.loads(line)
            float(record["t"])
            if not isinstance(record["group"], list):
                return "its group is not a list"
        except (ValueError, KeyError, TypeError) as e:
            return f"it is not a readable record ({type(e).__name__}: {e})"
        if "c" in record:
            at = line.find(_GROUP)
            if at < 0 or checksum(line[at + len(_GROUP) : -1]) != record["c"]:
                return "its group does not match its checksum"
        return None

    def read(self, line: int) -> list[dict]:
        """The records of the group on line `line`."""
        with open(self.path, "rb") as f:
            f.seek(self.starts[line])
            return json.loads(f.readline())["group"]  # type: ignore[no-any-return]


class FileBuffer(LedgerBuffer):
    storage_type = "file"

    def __init__(self, name: str, path: str, writer: str | None = None):
        super().__init__(name, path, writer)
        self.path = path
        try:
            os.makedirs(os.path.join(path, WRITERS), exist_ok=True)
        except OSError as e:
            raise BufferError(f"{self.describe()}: cannot create the folder: {e}") from None
        self._out: int | None = None
        """The writer's file descriptor (appending)."""
        self._end = 0
        """The length of the writer's file up to its last whole put."""
        self._lock: IO[bytes] | None = None
        self._files: dict[str, _Lines] = {}
        self._steps: list[list[tuple[str, int]]] = []
        self._taken: set[tuple[str, int]] = set()
        self._reading = False

    # ------------------------------------------------------------------ writer side

    def _writer_file(self) -> str:
        return os.path.join(self.path, WRITERS, f"{self.writer}.jsonl")

    def _open_out(self) -> int:
        """The writer's file, open to append; what an earlier handle of this writer left of a put
        it did not finish is cut first."""
        if self._out is None:
            path = self._writer_file()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            whole = _Lines(path)
            try:
                whole.scan()
            except OSError:
                os.close(fd)
                raise
            self._out, self._end = fd, whole.offset
        if os.fstat(self._out).st_size != self._end:  # a failed put whose cut failed too
            os.ftruncate(self._out, self._end)
        return self._out

    def _put(self, groups: list[Group]) -> None:
        now = time.time()
        data = "".join(line_of(now, g, more=i < len(groups) - 1) for i, g in enumerate(groups)).encode()
        try:
            _write_all(self._open_out(), data)
        except OSError as e:  # its last line is not whole: nothing of it is read; cut it
            if self._out is not None:
                try:
                    os.ftruncate(self._out, self._end)
                except OSError:
                    pass  # cut before the next put
            raise BufferError(
                f"{self.describe()}: a put of {len(groups)} group(s) failed and kept none of them: writing "
                f"{WRITERS}/{self.writer}.jsonl: {write_failed(str(e), 'explore')}"
            ) from None
        self._end += len(data)
        try:
            os.fsync(self._out)  # type: ignore[arg-type]
        except OSError as e:  # written whole, so readable: a resumed explorer counts it as put
            raise BufferError(
                f"{self.describe()}: a put of {len(groups)} group(s) was written but not confirmed on disk: fsync "
                f"of {WRITERS}/{self.writer}.jsonl: {write_failed(str(e), 'explore')}"
            ) from None

    def finish(self) -> None:
        try:
            self._open_out()  # a writer that put nothing still counts as one that finished
            with open(os.path.join(self.path, WRITERS, f"{self.writer}.done"), "w"):
                pass
        except OSError as e:
            raise BufferError(
                f"{self.describe()}: cannot mark writer {self.writer} finished in {WRITERS}/: "
                f"{write_failed(str(e), 'explore')}"
            ) from None

    # ------------------------------------------------------------------ reader side

    def _open_reader(self) -> None:
        """Take the reader's lock and load the ledger (dropping a last line cut short by a crash)."""
        if self._reading:
            return
        if self._lock is None:  # held already when the ledger is read anew (a step it failed to record)
            lock = open(os.path.join(self.path, READER_LOCK), "ab")
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                raise BufferError(
                    f"{self.describe()}: another trainer reads this buffer (it holds {READER_LOCK}); one reader per buffer"
                ) from None
            self._lock = lock
        self._steps = self._read_ledger(repair=True)
        self._taken = {p for step in self._steps for p in step}
        self._reading = True

    def _read_ledger(self, repair: bool) -> list[list[tuple[str, int]]]:
        """The steps taken; `repair`: cut a last line a crash left without its newline."""
        ledger = os.path.join(self.path, STEPS)
        if not os.path.exists(ledger):
            return []
        with open(ledger, "rb") as f:
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        if repair and len(complete) < len(data):
            with open(ledger, "r+b") as f:
                f.truncate(len(complete))
        return [[(w, int(n)) for w, n in json.loads(line)["groups"]] for line in complete.splitlines()]

    def _scan(self) -> None:
        folder = os.path.join(self.path, WRITERS)
        for entry in sorted(os.listdir(folder)):
            if entry.endswith(".jsonl"):
                writer = entry[: -len(".jsonl")]
                lines = self._files.setdefault(writer, _Lines(os.path.join(folder, entry)))
                for line in lines.scan():
                    step = next((k for k, pairs in enumerate(self._steps) if (writer, line) in pairs), None)
                    if step is not None:
                        log.warning(
                            "%s: %s; step %d took it already: passed over unless that step is trained "
                            "again (a resumed trainer retakes the steps after its checkpoint)",
                            self.describe(), self._damage(writer, line), step,
                        )  # fmt: skip

    def _damage(self, writer: str, line: int) -> str:
        lines = self._files[writer]
        return f"line {line + 1} of {lines.path} (writer {writer}) is damaged: {lines.damaged[line]}"

    def _unread(self) -> list[tuple[float, str, int]]:
        return sorted(
            (t, w, i)
            for w, lines in self._files.items()
            for i, t in enumerate(lines.times)
            if (w, i) not in self._taken
        )

    def _group(self, writer: str, line: int) -> Group:
        if writer not in self._files or line >= len(self._files[writer].starts):
            raise BufferError(
                f"{self.describe()}: the ledger names line {line} of writer {writer}, which is not in "
                f"{os.path.join(self.path, WRITERS)}: the buffer's files were changed or removed"
            )
        if line in self._files[writer].damaged:
            raise BufferError(
                f"{self.describe()}: {self._damage(writer, line)}; the group it held was acknowledged to "
                "its writer and cannot be given back: restore the file, or delete the line to train without it"
            )
        return [from_record(r, self.describe()) for r in self._files[writer].read(line)]

    def _recorded(self, step: int) -> list[Group] | None:
        self._open_reader()
        if step >= len(self._steps):
            return None
        self._scan()
        return [self._group(w, i) for w, i in self._steps[step]]

    def _steps_taken(self) -> int:
        self._open_reader()
        return len(self._steps)

    def _progress(self) -> tuple[int, int, int]:
        self._open_reader()
        self._scan()
        folder = os.path.join(self.path, WRITERS)
        finished = sum(1 for w in self._files if os.path.exists(os.path.join(folder, f"{w}.done")))
        return len(self._unread()), len(self._files), finished

    def _claim(self, step: int, num_groups: int) -> list[Group]:
        assert step == len(self._steps)
        pairs = [(w, i) for _, w, i in self._unread()[:num_groups]]
        groups = [self._group(w, i) for w, i in pairs]
        self._record(step, pairs)
        self._steps.append(pairs)
        self._taken.update(pairs)
        return groups

    def _record(self, step: int, pairs: list[tuple[str, int]]) -> None:
        """Append step `step` to the ledger; on failure cut it again and read the ledger anew at
        the next take (the file is the truth, should the cut fail)."""
        ledger = os.path.join(self.path, STEPS)
        fd = size = None
        try:
            fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            size = os.fstat(fd).st_size
            _write_all(fd, (json.dumps({"step": step, "groups": pairs}) + "\n").encode())
            os.fsync(fd)
        except OSError as e:
            if fd is not None and size is not None:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
            self._reading = False  # the next take reads the ledger anew
            raise BufferError(
                f"{self.describe()}: step {step} was not recorded in {STEPS}: {write_failed(str(e), 'train')}"
            ) from None
        finally:
            if fd is not None:
                os.close(fd)

    def groups_by_writer(self) -> dict[str, int] | None:
        self._scan()
        return {w: len(lines.starts) for w, lines in self._files.items()}

    def stats(self) -> BufferStats:
        self._scan()
        folder = os.path.join(self.path, WRITERS)
        steps = self._steps if self._reading else self._read_ledger(repair=False)
        taken = [p for step in steps for p in step]
        sizes = {(w, i): n for w, lines in self._files.items() for i, n in enumerate(lines.sizes)}
        return BufferStats(
            groups_written=len(sizes), experiences_written=sum(sizes.values()), groups_taken=len(taken),
            experiences_taken=sum(sizes.get(p, 0) for p in taken),
            available=len(sizes) - len(set(taken)), writers=len(self._files),
            writers_finished=sum(1 for w in self._files if os.path.exists(os.path.join(folder, f"{w}.done"))),
            steps_taken=len(steps),
        )  # fmt: skip

    def close(self) -> None:
        if self._out is not None:
            os.close(self._out)
        if self._lock is not None:
            self._lock.close()
        self._out, self._lock = None, None
