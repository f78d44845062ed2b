"""Metrics as JSON lines: the record of a run that needs no extra package and survives a crash."""

from __future__ import annotations

import json
import os
import time

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

    def log(self, metrics: dict[str, float], step: int) -> None:
        # float(): numpy / 0-d tensor scalars would not serialise
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def drop_after(run_dir: str, step: int) -> int:
    """Remove the records of steps after `step` from `<run_dir>/metrics.jsonl`, and a last line a
    crash cut short: a run resumed from step `step`'s checkpoint logs those steps again. Returns
    how many lines went."""
    path = os.path.join(run_dir, "metrics.jsonl")
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
