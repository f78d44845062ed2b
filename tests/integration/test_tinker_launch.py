"""rlcore's loop trained through `rlcore tinker serve` (trainer.remote tinker://...), driven by the
official `tinker` SDK inside the launch: the same run as rlcore's own trainer, and a lost service
ended in one line and resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from .launch_utils import REPO, heldout_taskset, launch, read_metrics, tiny_grpo_config
from .tinker_serving import KEY, MODEL
from .tinker_serving import serve as _serve

tinker = pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'rlcore[tinker]'")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


ONE_MODULE_ALGORITHM = "tests.integration.mean_baseline_algorithm:MEAN_BASELINE"


def _plan(root: str, model: str, **extra) -> dict:
    """An SFT warm-up of 2 steps, then a GRPO step of 4 tasks x 4 answers, then a step of an algorithm
    written outside rlcore in one module (ONE_MODULE_ALGORITHM), on the served model."""
    cfg = tiny_grpo_config(
        root, **{"model.model_path": model, "model.scratch": {"enabled": False}, "algorithm.kl_loss_coef": 0.0,
                 "buffer.explorer_input.eval_tasksets": [heldout_taskset(root, 8)], **extra}
    )  # fmt: skip
    cfg["stages"] = [
        {"name": "warmup", "mode": "train", "algorithm": {"algorithm_type": "sft"},
         "buffer": {"batch_size": 8, "total_steps": 2}},
        {"name": "rl", "mode": "both", "buffer": {"total_steps": 1}},
        {"name": "custom", "mode": "both", "algorithm": {"algorithm_type": ONE_MODULE_ALGORITHM},
         "buffer": {"total_steps": 1}},
    ]  # fmt: skip
    return cfg


def test_launch_through_a_tinker_service_is_the_run_rlcore_trains_itself(
    tinker_server, tiny_model_path, tmp_path, monkeypatch
) -> None:
    """trainer.remote tinker://: the loop runs in the launch, training through the service and
    sampling from it. The same plan trained by rlcore's own trainer and through the Tinker service
    gives the same SFT losses (the lr schedule and the token mean computed client-side), the same
    first GRPO step (the seeded samples, their rewards, the clipped loss with the advantages carrying
    the aggregation weights), and the same step of an algorithm added as one module outside rlcore
    (its advantage function computed in each, as it records)."""
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    record = tmp_path / "advantages.jsonl"
    monkeypatch.setenv("RLCORE_TEST_ADVANTAGES", str(record))
    local_root, remote_root = str(tmp_path / "local"), str(tmp_path / "tinker")
    launch(_plan(local_root, tiny_model_path), os.path.join(tmp_path, "local.yaml"))
    remote = _plan(
        remote_root, tiny_model_path, **{"trainer.remote": "tinker://" + tinker_server.removeprefix("http://"),
                                         "trainer.tinker": {"base_model": MODEL},
                                         "explorer.rollout_model.engine_type": "tinker"}
    )  # fmt: skip
    out = launch(remote, os.path.join(tmp_path, "tinker.yaml"))
    assert "trained by tinker://" in out.stdout

    def rows(root: str, stage: str) -> list[dict]:
        return read_metrics(os.path.join(root, "it", "run", stage))

    for a, b in zip(rows(local_root, "stage0_warmup"), rows(remote_root, "stage0_warmup"), strict=True):
        if "sft/loss" in a:
            assert b["sft/loss"] == pytest.approx(a["sft/loss"], rel=1e-5), (a, b)
            assert b["actor/lr"] == pytest.approx(a["actor/lr"], rel=1e-9)
    for stage in ("stage1_rl", "stage2_custom"):
        local_rl = [r for r in rows(local_root, stage) if "actor/loss" in r]
        tinker_rl = [r for r in rows(remote_root, stage) if "actor/loss" in r]
        assert len(local_rl) == len(tinker_rl) == 1, stage
        first, other = local_rl[0], tinker_rl[0]
        assert other["rollout/reward_mean"] == first["rollout/reward_mean"], stage
        assert other["actor/loss"] == pytest.approx(first["actor/loss"], rel=1e-4, abs=1e-6), stage
        assert other["actor/grad_norm"] == pytest.approx(first["actor/grad_norm"], rel=1e-4), stage
        assert "eval/heldout/accuracy" in rows(remote_root, stage)[-1]
    # the one-module algorithm's advantages, computed by the local trainer's rank, then by the launch
    # that trains through the service: the same rewards, each less its group's mean (each launch also
    # tried the function on its config check's batch of 4, core/algorithms/plugs.py)
    records = [json.loads(line) for line in record.read_text().splitlines()]
    steps = [r for r in records if len(r["rewards"]) == 16]  # 4 tasks x 4 answers
    probes = [r for r in records if r not in steps]
    assert len(steps) == 2 and probes and all(len(r["rewards"]) == 4 for r in probes), records
    assert steps[0]["groups"] == steps[1]["groups"] and steps[0]["rewards"] == steps[1]["rewards"]
    for step in steps:
        for group in set(step["groups"]):
            rows_of = [i for i, g in enumerate(step["groups"]) if g == group]
            mean = sum(step["rewards"][i] for i in rows_of) / len(rows_of)
            for i in rows_of:
                assert step["advantages"][i] == pytest.approx(step["rewards"][i] - mean, abs=1e-6)
    assert steps[0]["advantages"] == pytest.approx(steps[1]["advantages"], abs=1e-6)
    # each stage's checkpoints are the service's; the RL stage started from the warm-up's last
    with open(os.path.join(remote_root, "it", "run", "stage1_rl", "tinker_checkpoints.json")) as f:
        saved = json.load(f)
    assert saved[-1]["global_step"] == 1 and saved[-1]["path"].startswith("tinker://")


class _Launch:
    """`rlcore launch` of `cfg` in the background, its output in files beside its config."""

    def __init__(self, cfg: dict, path: str, *overrides: str):
        with open(path + ".yaml", "w") as f:
            yaml.safe_dump(cfg, f)
        self.out, self.err = path + ".out", path + ".err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "rlcore.cli", "launch", path + ".yaml", *overrides],
                                         cwd=REPO, stdout=out, stderr=err)  # fmt: skip

    def output(self) -> tuple[str, str]:
        with open(self.out) as out, open(self.err) as err:
            return out.read(), err.read()

    def wait_for(self, done, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert self.proc.poll() is None and time.monotonic() < deadline, (what, *self.output())
            time.sleep(0.1)

    def ended_within(self, timeout_s: float) -> tuple[int, float]:
        """The exit code and the seconds it took from now (fails past `timeout_s`)."""
        start = time.monotonic()
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(("still running", *self.output())) from None
        return rc, time.monotonic() - start


@pytest.mark.timeout(600)
def test_a_lost_service_ends_the_launch_in_one_line_and_the_run_resumes(
    tiny_model_path, tmp_path, monkeypatch
) -> None:
    """kill -9 of the Tinker server mid-run ends the launch within 60 s (two heartbeats of
    control.heartbeat_interval without an answer), in one line naming the service and what to do.
    Restarted on its folder and port, the server has the run's checkpoints: continue_from_checkpoint
    says where it resumes from; SIGINT while the server hangs (SIGSTOP: a call pending) ends the
    launch within seconds; the next resume completes the run."""
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    root = str(tmp_path)
    server, url = _serve(root, tiny_model_path)
    cfg = tiny_grpo_config(
        root, **{"model.model_path": tiny_model_path, "model.scratch": {"enabled": False},
                 "algorithm.kl_loss_coef": 0.0, "buffer.total_steps": 8, "trainer.save_interval": 1,
                 "trainer.remote": "tinker://" + url.removeprefix("http://"), "trainer.tinker": {"base_model": MODEL},
                 "explorer.rollout_model.engine_type": "tinker"}
    )  # fmt: skip
    record = os.path.join(root, "it", "run", "tinker_checkpoints.json")
    launches: list[_Launch] = []
    try:
        first = _Launch(cfg, os.path.join(root, "first"))
        launches.append(first)
        first.wait_for(lambda: os.path.isfile(record), 240, "a first checkpoint")
        server.kill()
        rc, killed_s = first.ended_within(60)
        errors = [line for line in first.output()[1].splitlines() if line.startswith("rlcore: error:")]
        assert rc == 1 and len(errors) == 1, first.output()
        assert f"the Tinker service at {url} stopped answering" in errors[0], errors
        assert "restart it, then resume the run with continue_from_checkpoint=true" in errors[0], errors

        server.wait()
        server, _ = _serve(root, tiny_model_path, port=int(url.rsplit(":", 1)[1]))
        resumed = re.compile(r"resumed main from (tinker://\S+) \(step (\d+)\)")
        with open(record) as f:
            newest = json.load(f)[-1]
        second = _Launch(cfg, os.path.join(root, "second"), "continue_from_checkpoint=true")
        launches.append(second)
        second.wait_for(lambda: resumed.search(second.output()[0]), 240, "the resume's line")
        hit = resumed.search(second.output()[0])
        assert hit is not None and hit.groups() == (newest["path"], str(newest["global_step"]))
        server.send_signal(signal.SIGSTOP)  # the calls that follow hang
        time.sleep(1.0)
        second.proc.send_signal(signal.SIGINT)
        rc, interrupted_s = second.ended_within(30)
        server.send_signal(signal.SIGCONT)
        err = second.output()[1]
        assert rc == 130 and interrupted_s < 10, (rc, interrupted_s, err)
        assert f"the Tinker service at {url} does not answer: stopping now" in err, err

        third = _Launch(cfg, os.path.join(root, "third"), "continue_from_checkpoint=true")
        launches.append(third)
        rc, _ = third.ended_within(240)
        out, err = third.output()
        assert rc == 0 and "resumed main from tinker://" in out and "rlcore: finished" in out, (out, err)
        with open(record) as f:
            assert json.load(f)[-1]["global_step"] == 8
        print(
            f"kill -9: the launch ended in {killed_s:.1f} s; SIGINT, server stopped: in {interrupted_s:.1f} s"
        )
    finally:
        for proc in [server] + [launch.proc for launch in launches]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
