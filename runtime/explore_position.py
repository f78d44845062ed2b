"""The explorer's saved position against what the experience buffer holds (mode explore).

After each step's put the explorer saves its position (explorer_state.json: the next explore step,
the tasks still running, the groups put per buffer writer). The put and that save are two acts, and
either may fail alone: a put can fail having kept its groups (a PostgreSQL commit whose answer was
lost, a file written whole whose fsync failed), or the save can fail after the put (a full disk).
So before a put the explorer writes the position after it (explorer_put.json, removed once the
position is saved); a resumed explorer asks the buffer how many groups the put's writer has there:
all of the put's, and it resumes after the put; none, and it explores the step again. Every group
is put once either way (the file and sql storages keep all of a put or none of it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from typing import Any

from ..buffer.base import BufferError, Group
from ..core.types import Task

log = logging.getLogger("rlcore.explore")

PUTTING = "explorer_put.json"
"""Beside the position: the position after the put under way."""


class ExplorePosition:
    """Where an explorer stands, saved in `state_file` with each step's put: the next explore step,
    the tasks still running (a resumed explorer sends them again), the groups put per buffer writer
    id, its earlier launches' included (a resumed explorer checks that the buffer still holds them)."""

    def __init__(self, state_file: str, step: int, stage: str, selection: Any = None):
        """`selection`: the stage's TaskSelection (its history and where its streams stand are
        saved with the position); None: the tasks come in the taskset's order."""
        self.state_file, self.step, self.stage, self.selection = state_file, step, stage, selection
        self.resend: list[Task] = []
        """Tasks that were still running when the explorer last stopped."""
        self.put: dict[str, int] = {}
        self.saved: dict[str, Any] | None = None
        """The position written after the last step."""

    def resume(self, buffer: Any) -> None:
        """Resume from `state_file` (continue_from_checkpoint), or from a put it began, if that landed."""
        saved = None
        if os.path.isfile(self.state_file):
            with open(self.state_file) as f:
                saved = json.load(f)
        if (position := resume_position(buffer, saved, self.state_file)) is not None:
            self.restore(position)

    def restore(self, saved: dict[str, Any]) -> None:
        """Resume from `saved` (a failed loop's position, or the one a checkpoint kept)."""
        self.step = int(saved["explore_step"])
        self.resend = [Task(**t) for t in saved.get("running", [])]
        self.put = {str(w): int(n) for w, n in saved.get("put", {}).items()}
        if self.selection is not None:
            if "task_selection" not in saved:
                raise ValueError(
                    f"{self.state_file}: the explorer's position was saved without "
                    "buffer.explorer_input.task_selection, so its task history is unknown: resume with the filter "
                    "and the curriculum off, or start a new run (another name=)"
                )
            self.selection.load_state_dict(saved["task_selection"])
        log.info(
            "resumed exploring %s at step %d%s", self.stage, self.step,
            f" ({len(self.resend)} task(s) that were still running are sent again)" if self.resend else "",
        )  # fmt: skip

    def check_buffer(self, buffer: Any) -> None:
        check_buffer_holds(buffer, self.put, self.state_file)

    def record(
        self, buffer: Any, groups: list[Group], running: list[Task] | None, version: int, lock: threading.Lock
    ) -> None:
        """A step's groups into `buffer` and the position after them saved, under `lock` (so that a
        checkpoint's snapshot sees both or neither); `running`: the tasks still running (None: no
        task scheduler)."""
        state: dict[str, Any] = {"explore_step": self.step + 1, "policy_version": version}
        if running is not None:
            state["running"] = [dataclasses.asdict(t) for t in running]
        state["put"] = dict(self.put)
        if self.selection is not None:  # the history with this step's rollouts, the walk before the next
            state["task_selection"] = self.selection.state_dict(self.step + 1)
        if groups:
            state["put"][buffer.writer] = self.put.get(buffer.writer, 0) + len(groups)
        with lock:
            if groups:
                begin_put(self.state_file, state)  # a resumed explorer asks the buffer whether the put landed
                buffer.put(groups)
            self.put, self.saved = dict(state["put"]), state
            self.step += 1
            save_position(self.state_file, state)
            if groups:
                end_put(self.state_file)


def save_position(path: str, state: dict[str, Any]) -> None:
    """Write `state` to `path` through a temporary file and a rename (whole or not at all); a
    failure is one line naming the file and the fix."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(state))
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        full = "free space there" if "space" in str(e) or "quota" in str(e) else "fix the cause"
        raise RuntimeError(
            f"the explorer's position could not be saved in {path}: {e}: {full}, then resume the explore "
            "launch with continue_from_checkpoint=true"
        ) from None


def begin_put(state_file: str, after: dict[str, Any]) -> None:
    """Before a put: the position after it, should the put or the save after it fail."""
    save_position(_putting(state_file), after)


def end_put(state_file: str) -> None:
    """The position after the put is saved."""
    os.remove(_putting(state_file))


def resume_position(buffer: Any, saved: dict[str, Any] | None, state_file: str) -> dict[str, Any] | None:
    """The position to resume from: `saved` (what `state_file` held), or the position after a put
    the stopped explorer began and did not confirm when the buffer holds that put's groups."""
    try:
        with open(_putting(state_file)) as f:
            after = json.load(f)
    except FileNotFoundError:
        return saved
    before = {str(w): int(n) for w, n in (saved or {}).get("put", {}).items()}
    put = {str(w): int(n) for w, n in after["put"].items() if before.get(w) != n}  # the put's writer
    held = buffer.groups_by_writer()  # None: a storage that cannot tell (queue): the put is done again
    step = int(after["explore_step"]) - 1
    landed = held is not None and all(held.get(w, 0) >= n for w, n in put.items())
    for w, n in put.items():
        if not landed and held is not None and held.get(w, 0) > before.get(w, 0):
            raise BufferError(
                f"{buffer.describe()}: it holds {held.get(w, 0) - before.get(w, 0)} of the {n - before.get(w, 0)} "
                f"groups writer {w} put in explore step {step} ({_putting(state_file)}): a storage keeps all of a "
                "put or none of it; restore the storage, or start a new run"
            )
    if landed and put:
        log.info(
            "explore step %d's groups had reached %s: exploring on from step %d",
            step,
            buffer.describe(),
            step + 1,
        )
        save_position(state_file, after)
    elif put:
        log.info("explore step %d's groups had not reached %s: exploring it again", step, buffer.describe())
    os.remove(_putting(state_file))
    return after if landed else saved


def check_buffer_holds(buffer: Any, put: dict[str, int], state_file: str) -> None:
    """Before exploring on from a checkpoint: the buffer holds every group this explorer put
    before it (per writer id). A storage that lost acknowledged groups (a damaged SQLite WAL, a
    truncated file) would otherwise be resumed past silently, and those groups never trained."""
    held = buffer.groups_by_writer() if put else None
    if held is None:
        return
    for writer, count in sorted(put.items()):
        if held.get(writer, 0) < count:
            raise BufferError(
                f"{buffer.describe()}: it holds {held.get(writer, 0)} of the {count} groups writer {writer} put "
                f"before this explorer's checkpoint ({state_file}): the storage lost groups it had acknowledged "
                "(a damaged database or file?); the trainer would never see them: restore the storage, or start "
                "a new run"
            )


def _putting(state_file: str) -> str:
    return os.path.join(os.path.dirname(state_file), PUTTING)
