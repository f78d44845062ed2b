"""The file and sql storages on a real full disk (a small tmpfs): a put that fails keeps none of its
groups and says so in one line naming the buffer, the path and the fix; a step whose ledger
cannot be written fails the same way; once space is freed, the puts done again and the rest give
the trainer every group exactly once (counted)."""

from __future__ import annotations

import os

import pytest

from rlcore.buffer.base import BufferError, ExperienceBuffer

from .full_disk import PAGE, fill, small_disk
from .storages import group, open_storage

FIX = "free space there, then resume the {} launch with continue_from_checkpoint=true"


def _batch(first: int, n: int) -> list:
    return [group(f"t{i}") for i in range(first, first + n)]


def _take_all(reader: ExperienceBuffer, step: int) -> list[str]:
    """Every step from `step` until the buffer is exhausted: the group ids taken."""
    ids = []
    while True:
        taken = reader.take(step, 4, timeout_s=5)
        ids += [g[0].group_id for g in taken.groups]
        step += 1
        if taken.exhausted:
            return ids


def _fails_in_one_line(call, *needles: str) -> str:
    with pytest.raises(BufferError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message and all(n in message for n in needles), message
    return message


@pytest.mark.parametrize("kind", ["file", "sql"])
def test_a_full_disk_loses_and_repeats_nothing_once_space_is_freed(kind: str, tmp_path) -> None:
    with small_disk(str(tmp_path / "disk"), 256 if kind == "file" else 1024) as disk:
        where = os.path.join(disk, "b") if kind == "file" else f"sqlite:///{disk}/b.db"
        writer, reader = open_storage(kind, where, "w1"), open_storage(kind, where)
        writer.put(_batch(0, 4))
        writer.put(_batch(4, 4))
        fillers = [fill(disk, leave=PAGE)]  # a page left: the next put (8 groups, ~8 KiB) starts, cannot end
        said = f"experience buffer 'exps' ({kind} {where}): "
        message = _fails_in_one_line(lambda: writer.put(_batch(8, 8)), said, FIX.format("explore"))
        assert ("No space left on device" if kind == "file" else "database or disk is full") in message
        if kind == "file":
            assert "writing writers/w1.jsonl: [Errno 28]" in message
        assert writer.groups_by_writer() == {"w1": 8}  # none of the failed put's groups
        fillers.append(fill(disk))
        if kind == "file":  # the trainer's first step: its ledger's first line needs a page
            _fails_in_one_line(
                lambda: reader.take(0, 4, timeout_s=5),
                said,
                "step 0 was not recorded in steps.jsonl: [Errno 28]",
                FIX.format("train"),
            )
        else:  # whichever write of the step meets the full disk first: the lease's renewal or the ledger
            _fails_in_one_line(lambda: reader.take(0, 4, timeout_s=5), said, FIX.format("train"))
        for f in fillers:  # space freed: the launches resume
            os.remove(f)
        writer.put(_batch(8, 8))  # the explorer's failed step, explored again
        writer.put(_batch(16, 4))
        writer.finish()
        first = [g[0].group_id for g in reader.take(0, 4, timeout_s=5).groups]  # the same handle takes it now
        reader.close()
        resumed = open_storage(kind, where)  # a trainer resumed from before step 0
        ids = _take_all(resumed, 0)
        assert ids[:4] == first and sorted(ids, key=lambda t: int(t[1:])) == [f"t{i}" for i in range(20)], ids
        stats = resumed.stats()
        assert stats.groups_written == stats.groups_taken == 20 and stats.available == 0
        for b in (writer, resumed):
            b.close()


def test_a_put_whose_cut_fails_too_is_never_read_and_is_cut_before_the_next(tmp_path, monkeypatch) -> None:
    """The full disk also refuses the cut (ftruncate): the lines of the failed put stay in the file,
    every one but the last (never written whole) marked as followed by more: the reader reads none of
    them, and the writer cuts them before its next put."""
    from rlcore.buffer import file

    with small_disk(str(tmp_path / "disk"), 256) as disk:
        folder = os.path.join(disk, "b")
        writer, reader = file.FileBuffer("exps", folder, "w1"), file.FileBuffer("exps", folder)
        writer.put(_batch(0, 4))
        path = os.path.join(folder, "writers", "w1.jsonl")
        whole = os.path.getsize(path)
        filler = fill(disk, leave=PAGE)

        def refuse(fd: int, length: int) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(file.os, "ftruncate", refuse)
            _fails_in_one_line(lambda: writer.put(_batch(4, 8)), "kept none of them")
        with open(path, "rb") as f:
            left = f.read()[whole:]
        assert left.count(b"\n") >= 1 and not left.endswith(b"\n")  # whole lines of it, and a cut one
        assert all(b'"m":1,"group":' in line for line in left.split(b"\n")[:-1])
        assert reader.stats().groups_written == 4 and writer.groups_by_writer() == {"w1": 4}
        os.remove(filler)
        writer.put(_batch(4, 8))
        writer.finish()
        assert os.path.getsize(path) > whole and reader.stats().groups_written == 12
        assert _take_all(reader, 0) == [f"t{i}" for i in range(12)]
        writer.close()
        reader.close()


def test_a_put_written_whole_whose_fsync_failed_is_said_and_counted(tmp_path, monkeypatch) -> None:
    """The disk took the whole put but would not confirm it (fsync): readable, so it is not cut; the
    one line says so, and the buffer counts it (a resumed explorer goes on after it)."""
    from rlcore.buffer import file

    writer = file.FileBuffer("exps", str(tmp_path / "b"), "w1")

    def refuse(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(file.os, "fsync", refuse)
        _fails_in_one_line(
            lambda: writer.put(_batch(0, 2)), "a put of 2 group(s) was written but not confirmed on disk: fsync of "
            "writers/w1.jsonl: [Errno 5] Input/output error: fix the cause, then resume the explore launch",
        )  # fmt: skip
    assert writer.groups_by_writer() == {"w1": 2}
    writer.put(_batch(2, 2))
    assert writer.groups_by_writer() == {"w1": 4}
    writer.close()
