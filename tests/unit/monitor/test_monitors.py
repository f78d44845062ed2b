"""Monitors: the jsonl record, TensorBoard event files, the console line, missing tracking packages."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from rlcore.core.monitor import MONITORS, MultiMonitor, build_monitors, check_monitor_dependencies
from rlcore.core.monitor.console import ConsoleMonitor
from rlcore.core.monitor.jsonl import JsonlMonitor


def test_jsonl_appends_one_object_per_call(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = time.time()
    monitor = JsonlMonitor(str(run_dir))
    monitor.log({"actor/loss": 0.5, "rollout/reward_mean": 0.25}, step=1)
    # flushed per line: readable before close
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    monitor.log({"actor/loss": 0.125}, step=2)
    monitor.close()

    first, second = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    assert before <= first["time"] <= second["time"] <= time.time()
    assert {k: v for k, v in first.items() if k != "time"} == {
        "step": 1,
        "actor/loss": 0.5,
        "rollout/reward_mean": 0.25,
    }
    assert {k: v for k, v in second.items() if k != "time"} == {"step": 2, "actor/loss": 0.125}

    resumed = JsonlMonitor(str(run_dir))  # a resumed run keeps the earlier lines
    resumed.log({"actor/loss": 0.0625}, step=3)
    resumed.close()
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
    ]


def test_tensorboard_writes_an_events_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monitor = build_monitors(["tensorboard"], str(tmp_path), project="p", name="n", config={})
    monitor.log({"actor/loss": 0.5}, step=1)
    monitor.log({"actor/loss": 0.25}, step=2)
    monitor.close()
    log_dir = tmp_path / "tensorboard"
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(log_dir))
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("actor/loss")] == [(1, 0.5), (2, 0.25)]


def test_console_prints_one_compact_line(tmp_path: Path) -> None:
    out = io.StringIO()
    monitor = ConsoleMonitor(file=out)
    metrics = {
        "rollout/reward_mean": 0.5,
        "actor/loss": 0.1234567,
        "actor/kl_loss": 0.001,
        "perf/tokens_per_s": 12345.6,
        "actor/lr": 1e-6,  # not a key metric: left out
        "eval/arith/accuracy": 0.25,
        "eval/arith/time_s": 3.0,  # not a key eval metric: left out
    }
    monitor.log(metrics, step=7)
    monitor.log({"sft/loss": 2.0}, step=8)
    monitor.close()
    # 0.1234567 -> 4 significant digits 0.1235; 12345.6 -> 12.3k
    assert out.getvalue().splitlines() == [
        "step 7 | reward 0.5 | loss 0.1235 | kl 0.001 | tok/s 12.3k | eval/arith/accuracy 0.25",
        "step 8 | loss 2",
    ]


def test_build_monitors_fans_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monitor = build_monitors(["console", "jsonl"], str(tmp_path), project="p", name="n", config={"seed": 1})
    assert isinstance(monitor, MultiMonitor)
    assert [type(m).__name__ for m in monitor.monitors] == ["ConsoleMonitor", "JsonlMonitor"]
    monitor.log({"actor/loss": 1.5}, step=3)
    monitor.close()
    assert capsys.readouterr().out == "step 3 | loss 1.5\n"
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["actor/loss"] == 1.5


def test_registry_matches_the_schema_choices() -> None:
    from rlcore.core.config.schema import MONITOR_TYPES

    assert tuple(MONITORS) == MONITOR_TYPES
    for name in ("console", "jsonl", "tensorboard"):  # the ones importable here resolve to Monitors
        assert MONITORS.resolve(name).__name__.endswith("Monitor")


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_missing_tracking_package_is_one_line(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # as if not installed (find_spec then finds nothing)
    assert importlib.util.find_spec(name) is None
    expected = f"monitor.monitor_type '{name}' needs the {name} package: pip install 'rlcore[tracking]'"
    with pytest.raises(ValueError) as err:
        check_monitor_dependencies(["console", name])
    assert str(err.value) == expected
    with pytest.raises(ValueError) as err:  # build checks before constructing anything
        build_monitors(["jsonl", name], str(tmp_path / "run"), project="p", name="n", config={})
    assert str(err.value) == expected
    assert not (tmp_path / "run").exists()


def test_unknown_monitor_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        check_monitor_dependencies(["jsonl", "neptune"])
    assert str(err.value) == (
        "monitor.monitor_type must be one of console, jsonl, tensorboard, wandb, mlflow; got 'neptune'"
    )


def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's own file store and client: the second launch of a run (a resume, its config changed
    by continue_from_checkpoint) logs into the first one's MLflow run; one run, the whole history."""
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'rlcore[tracking]')")
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # newer MLflow would rather have a database
    run_dir = str(tmp_path / "run")
    first = build_monitors(["mlflow"], run_dir, project="p", name="n", config={"resume": False, "lr": 0.1})
    first.log({"actor/loss": 0.5}, step=1)
    first.close()
    again = build_monitors(["mlflow"], run_dir, project="p", name="n", config={"resume": True, "lr": 0.1})
    again.log({"actor/loss": 0.25}, step=2)
    again.close()
    client = mlflow.tracking.MlflowClient()
    (experiment,) = [e for e in client.search_experiments() if e.name == "p"]
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "actor/loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    assert run.data.params == {"resume": "False", "lr": "0.1"}  # logged once, when the run started


def test_a_resumed_run_continues_its_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb itself, offline: the second launch of a run resumes the W&B run the first started."""
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'rlcore[tracking]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = str(tmp_path / "run")
    first = build_monitors(["wandb"], run_dir, project="p", name="n", config={"lr": 0.1})
    first_id = first.monitors[0]._run.id if isinstance(first, MultiMonitor) else first._run.id
    first.log({"actor/loss": 0.5}, step=1)
    first.close()
    again = build_monitors(["wandb"], run_dir, project="p", name="n", config={"lr": 0.1})
    again_run = again.monitors[0]._run if isinstance(again, MultiMonitor) else again._run
    assert again_run.id == first_id and open(os.path.join(run_dir, "wandb_run_id")).read() == first_id
    again.log({"actor/loss": 0.25}, step=2)
    again.close()
