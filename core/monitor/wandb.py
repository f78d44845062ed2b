"""Metrics to Weights & Biases (needs the wandb package: pip install 'rlcore[tracking]')."""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .base import Monitor, remember_id, remembered_id
from .jsonl import COMPLETIONS, METRICS, read_records

log = logging.getLogger(__name__)

RUN_ID_FILE = "wandb_run_id"
"""The W&B run's id, kept in the run folder: a resumed run continues that W&B run."""

DURABLE_FILE = "wandb_durable_step"
"""The step up to which the W&B run surely holds every row: written when a launch closes the run
(wandb's finish writes all it was given); a launch that dies loses what wandb had not written yet."""


class WandbMonitor(Monitor):
    """One W&B run per rlcore run: project and name from the config, the resolved config as its
    config. Its id is kept in the run folder, so a resumed run (continue_from_checkpoint) logs on
    into the same W&B run instead of starting a second one.

    W&B refuses a step lower than the last one it has (the steps a resumed run logs again), and a
    launch that dies loses the rows wandb had not written yet (the last step's, and seconds before
    it). So a resumed run rewinds the W&B run (`resume_from`) to the last step it surely holds
    (`wandb_durable_step`, at most the step resumed from) and logs again, from metrics.jsonl, the
    steps after that one up to the step resumed from: each step is in the run once, with the values
    logged last. Where the W&B run cannot be rewound (no launch has closed it: what it holds is not
    known; or the server does not offer rewinding), a new W&B run takes over, with metrics.jsonl's
    history up to that step. Without the jsonl monitor there is nothing to log again: the run is
    rewound to the step resumed from, and keeps what it lost."""

    def __init__(
        self, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ):
        import wandb  # only when selected; check_monitor_dependencies explains a missing package

        def start(**how: Any) -> Any:
            return wandb.init(project=project, name=name, config=config, dir=run_dir, **how)

        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = run_dir
        self.last_step = -1 if resumed_at is None else resumed_at
        run_id = remembered_id(run_dir, RUN_ID_FILE)
        if resumed_at is None:
            self._run = start(id=run_id, resume="allow" if run_id else None)
        else:
            replays = "jsonl" in config.get("monitor", {}).get("monitor_type", [])
            self._run = self._resumed(start, run_id, resumed_at, replays)
        remember_id(run_dir, RUN_ID_FILE, self._run.id)

    def _resumed(self, start: Callable[..., Any], run_id: str | None, resumed_at: int, replays: bool) -> Any:
        """The W&B run rewound to the last step it surely holds, then given again what metrics.jsonl
        holds past that step up to `resumed_at`; a new run given all of it where that cannot be."""
        import wandb

        durable = _durable_step(self.run_dir)
        keep = resumed_at if not replays else None if durable is None else min(durable, resumed_at)
        run, kept = None, -1
        if run_id is not None and keep is not None:
            try:
                run, kept = start(resume_from=f"{run_id}?_step={keep}"), keep
            except wandb.Error as e:
                log.warning(
                    "W&B run %s cannot be rewound to step %d (%s): starting a new one", run_id, keep, e
                )
        if run is None:
            if run_id is not None and keep is None:
                log.warning(
                    "W&B run %s was never closed by a launch of this run, so what it holds is not known: a new "
                    "W&B run takes over, with metrics.jsonl's history up to step %d", run_id, resumed_at,
                )  # fmt: skip
            run = start()
        _write_durable(self.run_dir, kept)
        self._run = run
        if replays:
            self._replay(kept, resumed_at)
        return run

    @classmethod
    def from_run(
        cls, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ) -> WandbMonitor:
        return cls(run_dir, project, name, config, resumed_at)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)
        self.last_step = max(self.last_step, step)

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """A W&B table `completions` per step."""
        import wandb

        if not rows:
            return
        columns: list[str | int] = ["prompt", "response", "reward", "finish_reason", "group", "counts"]
        data = [
            [
                r["prompt"],
                r["response"],
                r["reward"],
                r["finish_reason"],
                r["group"],
                str(r.get("counts", {})),
            ]
            for r in rows
        ]
        self._run.log({"completions": wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self._run.finish()
        _write_durable(self.run_dir, self.last_step)

    def _replay(self, after: int, upto: int) -> None:
        """Log again what metrics.jsonl and completions.jsonl hold of the steps after `after` up to
        `upto`, in step order."""
        metrics: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for record in read_records(self.run_dir, METRICS, upto):
            metrics[record.pop("step")].append(record)
        completions: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for record in read_records(self.run_dir, COMPLETIONS, upto):
            completions[record.pop("step")].append(record)
        for step in sorted(s for s in {*metrics, *completions} if s > after):
            for record in metrics[step]:
                record.pop("time", None)
                self._run.log(record, step=step)
            self.log_completions(completions[step], step)


def _durable_step(run_dir: str) -> int | None:
    path = os.path.join(run_dir, DURABLE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return int(f.read())


def _write_durable(run_dir: str, step: int) -> None:
    path = os.path.join(run_dir, DURABLE_FILE)
    if step >= 0:
        remember_id(run_dir, DURABLE_FILE, str(step))
    elif os.path.exists(path):
        os.remove(path)
