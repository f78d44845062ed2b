"""Every step's metrics are in each tracker once, the values logged last, across launches killed
(SIGKILL, no close) and resumed from a checkpoint before the last step they logged: metrics.jsonl,
TensorBoard's event files (read by TensorBoard's own EventAccumulator), MLflow's file store (read by
MlflowClient) and W&B's offline run files (read record by record, as `wandb sync` sends them)."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

TRACKERS = ("tensorboard", "mlflow", "wandb")

LAUNCH = """
import json, os, signal, sys
from rlcore.core.monitor import build_monitors
a = json.loads(sys.argv[1])
config = {"monitor": {"monitor_type": a["types"]}}
monitor = build_monitors(a["types"], a["run_dir"], "p", "n", config, resumed_at=a["resumed_at"])
for step in a["steps"]:
    monitor.log({"loss": step + a["offset"]}, step)
    if step == 2:  # a second row at one step (an evaluation's), other keys
        monitor.log({"eval/accuracy": step + a["offset"]}, step)
    if step == 3:
        monitor.log_completions([{"prompt": "1+1=", "response": "2", "reward": 1.0, "finish_reason": "stop",
                                  "group": a["offset"], "policy_version": 0, "counts": {}}], step)
if a["kill"]:
    os.kill(os.getpid(), signal.SIGKILL)
monitor.close()
"""

# (step resumed from, steps logged, killed at the end): launch i logs `step + 100 * i`
LAUNCHES = [
    (None, range(1, 7), True),
    (4, range(5, 9), False),
    (6, range(7, 10), True),
    (8, range(9, 11), False),
]
EXPECTED = {step: step + 100 * launch for launch, steps in enumerate([(1, 2, 3, 4), (5, 6), (7, 8), (9, 10)])
            for step in steps}  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The launches of LAUNCHES, each a process, with the jsonl monitor and every tracker installed."""
    root = tmp_path_factory.mktemp("resumed")
    types = ["jsonl"] + [t for t in TRACKERS if importlib.util.find_spec(t) is not None]
    run_dir = str(root / "run")
    for i, (resumed_at, steps, kill) in enumerate(LAUNCHES):
        args = {"types": types, "run_dir": run_dir, "resumed_at": resumed_at, "steps": list(steps),
                "offset": 100 * i, "kill": kill}  # fmt: skip
        started = time.time()
        done = subprocess.run(
            [sys.executable, "-c", LAUNCH, json.dumps(args)], env=_env(root), capture_output=True, text=True
        )
        assert done.returncode == (-9 if kill else 0), done.stderr[-3000:]
        # event files and W&B run folders are named by the second they start: the next launch
        # starts in a later second (a launch importing the trackers takes seconds already)
        time.sleep(max(0.0, started + 1.1 - time.time()))
    return run_dir


def _env(root: Path) -> dict[str, str]:
    """Each launch its own wandb service, as separate launches have (WANDB_SERVICE, set by a wandb run
    of this process, would share this process's: it keeps a killed launch's run open)."""
    return {
        **{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
        "WANDB_MODE": "offline", "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": (root / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
    }  # fmt: skip


def test_jsonl_holds_each_step_once(run_dir: str) -> None:
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert _per_step(records, "loss") == EXPECTED
    assert _per_step(records, "eval/accuracy") == {2: EXPECTED[2]}
    completions = [json.loads(line) for line in open(os.path.join(run_dir, "completions.jsonl"))]
    assert [(c["step"], c["group"]) for c in completions] == [(3, 0)]


def test_tensorboard_shows_each_step_once(run_dir: str) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'rlcore[tracking]')")
    assert _tensorboard(run_dir, "loss") == EXPECTED
    assert _tensorboard(run_dir, "eval/accuracy") == {2: EXPECTED[2]}


def test_mlflow_run_holds_each_step_once(run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'rlcore[tracking]')")
    for key, value in _env(Path(run_dir).parent).items():
        if key.startswith("MLFLOW_"):
            monkeypatch.setenv(key, value)
    assert _mlflow(run_dir, "loss") == EXPECTED
    assert _mlflow(run_dir, "eval/accuracy") == {2: EXPECTED[2]}


def test_wandb_run_holds_each_step_once(run_dir: str) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'rlcore[tracking]')")
    history = _wandb_history(run_dir)
    assert {step: row["loss"] for step, row in history.items()} == EXPECTED
    evaluated = {step: row["eval/accuracy"] for step, row in history.items() if "eval/accuracy" in row}
    assert evaluated == {2: EXPECTED[2]}
    assert [step for step, row in history.items() if "completions/_type" in row] == [3]  # its table


def _per_step(records: list[dict], key: str) -> dict[int, float]:
    """{step: value} of `key`, failing when a step has it twice."""
    values: dict[int, float] = {}
    for record in records:
        if key in record:
            assert record["step"] not in values, f"step {record['step']} has {key} twice"
            values[record["step"]] = record[key]
    return values


def _tensorboard(run_dir: str, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    return _per_step([{"step": e.step, tag: e.value} for e in events.Scalars(tag)], tag)


def _mlflow(run_dir: str, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    (experiment,) = [e for e in client.search_experiments() if e.name == "p"]
    (run,) = client.search_runs([experiment.experiment_id])  # the runs taken over are deleted
    assert run.info.run_id == open(os.path.join(run_dir, "mlflow_run_id")).read()
    history = client.get_metric_history(run.info.run_id, key)
    return _per_step([{"step": m.step, key: m.value} for m in history], key)


def _wandb_history(run_dir: str) -> dict[int, dict]:
    """The W&B run's history as the W&B server builds it from the run's offline files, in the order
    they were written: a file that rewinds the run (`resume_from`) drops the steps after its branch
    point; a row at a step the run has already is refused."""
    from wandb.proto import wandb_internal_pb2

    run_id = open(os.path.join(run_dir, "wandb_run_id")).read()
    folder = os.path.join(run_dir, "wandb")
    history: dict[int, dict] = {}
    for name in sorted(n for n in os.listdir(folder) if n.startswith("offline-run-") and n.endswith(run_id)):
        for data in _wandb_records(os.path.join(folder, name, f"run-{run_id}.wandb")):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.HasField("run") and record.run.branch_point.run == run_id:
                history = {s: row for s, row in history.items() if s <= record.run.branch_point.value}
            if record.HasField("history"):
                items = record.history.item
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
                step = record.history.step.num
                assert step not in history, f"W&B refuses step {step}: the run has it already"
                history[step] = {k: v for k, v in row.items() if not k.startswith("_")}
    return history


def _wandb_records(path: str) -> list[bytes]:
    """The records of a .wandb file: a 7-byte header (':W&B', magic, version), then LevelDB's log
    format: 32 KiB blocks of chunks, each a 7-byte header (CRC-32, length, type: full, first,
    middle, last) and its bytes."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", path
    block, pos, records, parts = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        parts, pos = parts + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # full, last
            records.append(parts)
            parts = b""
        elif kind == 0:  # a zero-filled tail: a file that was not written to its end
            break
    return records
