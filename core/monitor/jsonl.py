"""Metrics as JSON lines: the record of a run that needs no extra package and survives a crash."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from .base import Monitor

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
COMPLETIONS = "completions.jsonl"


class JsonlMonitor(Monitor):
    """Appends `{"step": step, "time": unix_time, **metrics}` to `<run_dir>/metrics.jsonl`.

    Appending (not truncating) keeps the history of a resumed run in one file; every line is
    flushed so a crash loses nothing already logged. A resumed run first drops the lines past the
    step it resumed from (`resumed_at`), which it logs again.
    """

    def __init__(self, run_dir: str, resumed_at: int | None = None):
        os.makedirs(run_dir, exist_ok=True)
        if resumed_at is not None:
            dropped = drop_after(run_dir, resumed_at)
            drop_after(run_dir, resumed_at, COMPLETIONS)
            if dropped:
                log.info(
                    "dropped %d %s line(s) past step %d, to be logged again", dropped, METRICS, resumed_at
                )
        self.path = os.path.join(run_dir, METRICS)
        self._file = open(self.path, "a")
        self._completions: Any = None

    @classmethod
    def from_run(
        cls, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ) -> JsonlMonitor:
        return cls(run_dir, resumed_at)

    def log(self, metrics: dict[str, float], step: int) -> None:
        # float(): numpy / 0-d tensor scalars would not serialise
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """Appended to `<run_dir>/completions.jsonl`, one line per rollout with its step."""
        if self._completions is None:
            self._completions = open(os.path.join(os.path.dirname(self.path), COMPLETIONS), "a")
        for row in rows:
            self._completions.write(json.dumps({"step": step, **row}) + "\n")
        self._completions.flush()

    def close(self) -> None:
        self._file.close()
        if self._completions is not None:
            self._completions.close()


def read_records(run_dir: str, name: str = METRICS, upto: int | None = None) -> list[dict[str, Any]]:
    """The records of `<run_dir>/<name>` (metrics.jsonl or completions.jsonl) in file order, those of
    steps up to `upto` when given; a line a crash cut short is left out."""
    path = os.path.join(run_dir, name)
    if not os.path.isfile(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
                step = record["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if upto is None or step <= upto:
                records.append(record)
    return records


def drop_after(run_dir: str, step: int, name: str = METRICS) -> int:
    """Remove the records of steps after `step` from `<run_dir>/<name>` (metrics.jsonl or
    completions.jsonl), and a last line a crash cut short: a run resumed from step `step`'s
    checkpoint logs those steps again. Returns how many lines went."""
    path = os.path.join(run_dir, name)
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = f.read().splitlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    if len(kept) < len(lines):
        with open(path + ".tmp", "w") as f:
            f.write("".join(line + "\n" for line in kept))
        os.replace(path + ".tmp", path)
    return len(lines) - len(kept)
