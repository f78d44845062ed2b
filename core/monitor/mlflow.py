"""Metrics to MLflow (needs the mlflow package: pip install 'rlcore[tracking]').

The tracking server comes from MLflow's own settings (MLFLOW_TRACKING_URI); the rlcore project is
the experiment, the run name the MLflow run name, and the config is logged as flat `a.b.c` params.
A resumed rlcore run continues its MLflow run (the id is kept in the run folder).
"""

from __future__ import annotations

import logging
from typing import Any

from .base import Monitor, remember_id, remembered_id

log = logging.getLogger(__name__)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


RUN_ID_FILE = "mlflow_run_id"
"""The MLflow run's id, kept in the run folder: a resumed run continues that MLflow run."""

CONTINUES_TAG = "rlcore.continues"
"""On an MLflow run that took over an earlier one's history up to a checkpoint: that run's id."""


class MlflowMonitor(Monitor):
    """One MLflow run per rlcore run; its id is kept in the run folder, so a resumed run
    (continue_from_checkpoint) logs on into the same MLflow run. The config is logged once, when
    the MLflow run starts (MLflow refuses a param's value changed, and a resume changes
    continue_from_checkpoint).

    MLflow keeps every value logged at a step, and has no call that removes one. So when the run
    to continue holds values past the step resumed from (a launch killed between checkpoints), a
    new MLflow run takes over: the old one's params, tags and history up to that step, tagged
    `rlcore.continues` with the old id, which is then deleted (`mlflow gc` purges it, `mlflow runs
    restore` brings it back). Each step's values are in the run once, the last ones logged."""

    def __init__(
        self, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ):
        import mlflow  # only when selected; check_monitor_dependencies explains a missing package

        self._mlflow = mlflow
        run_id = remembered_id(run_dir, RUN_ID_FILE)
        if run_id is not None:
            try:
                if resumed_at is not None:
                    run_id = _without_steps_after(mlflow.tracking.MlflowClient(), run_id, resumed_at)
                    remember_id(run_dir, RUN_ID_FILE, run_id)
                self._run = mlflow.start_run(run_id=run_id)
                return
            except mlflow.exceptions.MlflowException as e:  # deleted, or another tracking server
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                log.warning(
                    "MLflow run %s of this run cannot be continued (%s): starting a new one", run_id, first
                )
        mlflow.set_experiment(project)
        self._run = mlflow.start_run(run_name=name, tags={"rlcore.run_dir": run_dir})
        remember_id(run_dir, RUN_ID_FILE, self._run.info.run_id)
        mlflow.log_params(_flatten(config))

    @classmethod
    def from_run(
        cls, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ) -> MlflowMonitor:
        return cls(run_dir, project, name, config, resumed_at)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


def _without_steps_after(client: Any, run_id: str, step: int) -> str:
    """`run_id` when its history ends at `step`; else a new run holding what it held up to `step`
    (params, tags, metric history), with `run_id` deleted."""
    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH

    old = client.get_run(run_id)
    if old.info.lifecycle_stage == "deleted":  # start_run refuses it: a new run starts
        return run_id
    history = [m for key in old.data.metrics for m in client.get_metric_history(run_id, key)]
    if all(m.step <= step for m in history):
        return run_id
    tags = {k: v for k, v in old.data.tags.items() if k != "mlflow.runName"}
    new = client.create_run(
        old.info.experiment_id, run_name=old.info.run_name, tags={**tags, CONTINUES_TAG: run_id}
    )
    new_id = new.info.run_id
    params = [Param(k, v) for k, v in old.data.params.items()]
    for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(new_id, params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH])
    kept = sorted((m for m in history if m.step <= step), key=lambda m: (m.step, m.timestamp))
    for i in range(0, len(kept), MAX_METRICS_PER_BATCH):
        client.log_batch(new_id, metrics=kept[i : i + MAX_METRICS_PER_BATCH])
    client.delete_run(run_id)
    log.warning(
        "MLflow run %s holds values past step %d, which this resumed run logs again: run %s goes on from its "
        "history up to step %d, and %s is deleted", run_id, step, new_id, step, run_id,
    )  # fmt: skip
    return new_id
