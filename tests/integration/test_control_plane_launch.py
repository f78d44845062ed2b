"""`rlcore launch` over the control plane: rollout workers as separate processes, the RunService
in the launch process, and the loop driving a separately started trainer (trainer.remote)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import yaml

from rlcore.client import ClientOptions, RunClient
from tests.integration.launch_utils import REPO, launch, read_metrics, tiny_grpo_config, wait_for_port_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOKEN = "control-plane-test-token"


def _env() -> dict[str, str]:
    return dict(os.environ, RLCORE_TOKEN=TOKEN)


def _keys(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if key in r]


def test_rollout_worker_process_trains_exactly_like_the_in_process_engine(tmp_path, monkeypatch) -> None:
    """One rollout worker (its own process, weights broadcast over gloo each step) against the same
    engine inside trainer rank 0 (weights copied in memory): the same seeds must give the same
    samples, rewards and losses at every step, which only holds if every sync delivered the
    trainer's weights exactly."""
    monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
    runs = {}
    for mode in ("both", "colocate"):
        root = str(tmp_path / mode)
        cfg = tiny_grpo_config(root, **{"buffer.total_steps": 3})
        proc = launch(cfg, os.path.join(root + ".yaml"), f"mode={mode}")
        if mode == "both":
            assert "rollout workers ready: 127.0.0.1:" in proc.stdout
        runs[mode] = read_metrics(os.path.join(root, "it", "run"))
    both, colocate = runs["both"], runs["colocate"]
    assert len(_keys(both, "rollout/reward_mean")) == 3
    assert _keys(both, "rollout/reward_mean") == _keys(colocate, "rollout/reward_mean")
    assert _keys(both, "rollout/response_len_mean") == _keys(colocate, "rollout/response_len_mean")
    for a, b in zip(_keys(both, "actor/pg_loss"), _keys(colocate, "actor/pg_loss"), strict=True):
        assert abs(a - b) < 1e-5
    assert all(s > 0 for s in _keys(both, "perf/sync_gb_per_s"))  # a real transfer happened each step
    # The step's breakdown: every update phase timed on both; the engine/reward split only where
    # the engine runs in the trainer's process (a worker over gRPC reports the rollout as a whole).
    for rows in (both, colocate):
        steps = [r for r in rows if "perf/step_time_s" in r]
        for r in steps:
            assert r["perf/forward_backward_s"] > 0 and r["perf/optimizer_s"] > 0
            assert r["perf/old_logprobs_s"] > 0  # the tiny config recomputes old log-probs
            timed = r["perf/generate_s"] + r["perf/old_logprobs_s"] + r["perf/train_s"]
            assert timed <= r["perf/step_time_s"]
    assert all(
        r["perf/rollout_engine_s"] > 0 and r["perf/rollout_reward_s"] > 0
        for r in colocate
        if "perf/step_time_s" in r
    )
    assert not any("perf/rollout_engine_s" in r for r in both)


def test_run_service_streams_metrics_and_stops_the_run(tmp_path) -> None:
    """A client in another process watches the live metrics of a launch with two rollout workers
    and stops the run after its first step: the run checkpoints and ends early, cleanly."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(root, **{"buffer.total_steps": 50, "explorer.rollout_model.engine_num": 2})
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, env=_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    address = None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "RunService) on " in line:
            address = line.rsplit(" ", 1)[-1].strip()
            break
    assert address, "".join(lines)
    rest: list[str] = []
    drain = threading.Thread(target=lambda: rest.extend(proc.stdout or []), daemon=True)
    drain.start()
    with RunClient(address, ClientOptions(token=TOKEN, timeout=300)) as client:
        records = []
        for record in client.stream_metrics(include_history=True):
            records.append(record)
            if any("rollout/reward_mean" in r.metrics for r in records):
                assert client.stop() == "STOPPING"
                break
        status = client.get_status()
        roles = sorted(w.role for w in status.workers)
    assert roles == ["rollout", "rollout", "trainer"], roles
    assert proc.wait(timeout=300) == 0, "".join(lines + rest)
    drain.join(10)
    steps = _keys(read_metrics(os.path.join(root, "it", "run")), "rollout/reward_mean")
    assert 1 <= len(steps) < 50  # stopped early, between steps
    assert os.path.isfile(os.path.join(root, "it", "run", "latest")) or any(
        d.startswith("global_step_") for d in os.listdir(os.path.join(root, "it", "run"))
    )


@contextlib.contextmanager
def _trainer_server(root: str) -> Iterator[str]:
    """`rlcore trainer serve` with 2 ranks, started by hand; yields its address, stops it cleanly."""
    port_file = os.path.join(root, "trainer.port")
    server = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "trainer", "serve", "--ranks", "2", "--port", "0",
         "--port-file", port_file, "--threads", "1"],
        cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield wait_for_port_file(port_file, server, "trainer")
    finally:
        server.terminate()
        assert server.wait(timeout=60) == 0


def test_remote_trainer_serves_a_later_stage_with_explorer_driven_checkpoint_syncs(
    tmp_path, monkeypatch
) -> None:
    """trainer.remote across stages: SFT (no workers involved), then GRPO that syncs by HF folder
    (sync_method checkpoint) only when the workers would lag more than max_staleness 1. The GRPO
    stage pushes its weights before the first rollout: the workers still hold the initial model
    (the SFT stage never synced them), and the log-prob gap of the first step would show it."""
    root = str(tmp_path)
    with _trainer_server(root) as address:
        cfg = tiny_grpo_config(root, **{"trainer.remote": address})
        cfg["stages"] = [
            {"name": "warmup", "mode": "train", "algorithm": {"algorithm_type": "sft"},
             "buffer": {"batch_size": 8, "total_steps": 4}},
            {"name": "rl", "mode": "both", "buffer": {"total_steps": 4},
             "synchronizer": {"sync_style": "explorer_driven", "max_staleness": 1, "sync_method": "checkpoint",
                              "probe": True}},
        ]  # fmt: skip
        monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
        launch(cfg, os.path.join(root, "cfg.yaml"))
        rl_dir = os.path.join(root, "it", "run", "stage1_rl")
        rows = [r for r in read_metrics(rl_dir) if "rollout/reward_mean" in r]
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        # synced at the start (step 0) and before the third rollout (the workers would lag 2 > 1)
        assert _keys(rows, "rollout/staleness_mean") == [0.0, 1.0, 0.0, 1.0]
        assert [("perf/sync_s" in r) for r in rows] == [False, False, True, False]
        assert _keys(rows, "sync/probe_engines") == [1.0]
        # the engine's log-probs equal the trainer's where the workers were synced for the rollout,
        # and lag one optimizer step behind where they were not
        gap = _keys(rows, "rollout/logprob_diff_mean")
        assert gap[0] < 1e-4 and gap[2] < 1e-4 and gap[1] > 1e-3 and gap[3] > 1e-3, gap
        # the workers loaded HF folders from the trainer; only the newest is kept
        assert os.listdir(os.path.join(rl_dir, "weight_sync")) == ["version_2"]


def test_launch_uses_endpoints_listed_in_the_config(tmp_path, monkeypatch, tiny_model_path) -> None:
    """explorer.rollout_model.endpoints: a worker started by hand is used instead of spawning one
    (the run's scratch model has the tiny model's architecture, so the first sync overwrites it)."""
    root = str(tmp_path)
    port_file = os.path.join(root, "worker.port")
    worker = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", tiny_model_path, "--port", "0",
         "--port-file", port_file, "--threads", "1", "--max-model-len", "256"],
        cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        address = wait_for_port_file(port_file, worker, "worker")
        cfg = tiny_grpo_config(
            root, **{"buffer.total_steps": 2, "explorer.rollout_model.endpoints": [address]}
        )
        cfg["model"] = {"model_path": tiny_model_path, "max_model_len": 48, "max_prompt_tokens": 16,
                        "max_response_tokens": 8}  # fmt: skip
        monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
        proc = launch(cfg, os.path.join(root, "cfg.yaml"))
        assert "starting" not in proc.stdout  # nothing spawned
        assert len(_keys(read_metrics(os.path.join(root, "it", "run")), "rollout/reward_mean")) == 2
    finally:
        worker.terminate()
        assert worker.wait(timeout=60) == 0

    # a listed worker that does not answer fails before any trainer rank starts, naming the key
    cfg = tiny_grpo_config(str(tmp_path / "dead"), **{"explorer.rollout_model.endpoints": [address]})
    path = str(tmp_path / "dead.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    proc2 = subprocess.run([sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc2.returncode == 2
    assert f"explorer.rollout_model.endpoints[0]: {address} does not answer (UNAVAILABLE" in proc2.stderr
