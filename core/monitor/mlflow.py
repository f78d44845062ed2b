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


class MlflowMonitor(Monitor):
    """One MLflow run per rlcore run; its id is kept in the run folder, so a resumed run
    (continue_from_checkpoint) logs on into the same MLflow run. The config is logged once, when
    the MLflow run starts (MLflow refuses a param's value changed, and a resume changes
    continue_from_checkpoint)."""

    def __init__(self, run_dir: str, project: str, name: str, config: dict[str, Any]):
        import mlflow  # only when selected; check_monitor_dependencies explains a missing package

        self._mlflow = mlflow
        run_id = remembered_id(run_dir, RUN_ID_FILE)
        if run_id is not None:
            try:
                self._run = mlflow.start_run(run_id=run_id)
                return
            except mlflow.exceptions.MlflowException as e:  # deleted, or another tracking server
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                log.warning("MLflow run %s of this run cannot be continued (%s): starting a new one", run_id, first)
        mlflow.set_experiment(project)
        self._run = mlflow.start_run(run_name=name, tags={"rlcore.run_dir": run_dir})
        remember_id(run_dir, RUN_ID_FILE, self._run.info.run_id)
        mlflow.log_params(_flatten(config))

    @classmethod
    def from_run(cls, run_dir: str, project: str, name: str, config: dict[str, Any]) -> MlflowMonitor:
        return cls(run_dir, project, name, config)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()
