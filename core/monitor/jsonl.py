"""Metrics as JSON lines: the record of a run that needs no extra package and survives a crash."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .base import Monitor


class JsonlMonitor(Monitor):
    """Appends `{"step": step, "time": unix_time, **metrics}` to `<run_dir>/metrics.jsonl`.

    Appending (not truncating) keeps the history of a resumed run in one file; every line is
    flushed so a crash loses nothing already logged.
    """

    def __init__(self, run_dir: str):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._file = open(self.path, "a")
        self._completions: Any = None

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


COMPLETIONS = "completions.jsonl"


def drop_after(run_dir: str, step: int, name: str = "metrics.jsonl") -> int:
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
