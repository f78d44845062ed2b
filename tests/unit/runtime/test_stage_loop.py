"""StageLoop (runtime/loop.py), the one schedule of every run, over a fake trainer handle: an SFT
stage's steps train the taskset's rows, log a row each, checkpoint at trainer.save_interval and at
the end, resume from a checkpoint at the step it holds, and stop with a checkpoint when the run asks;
over a fake step source, the schedule steps where the source says and ends when it runs dry."""

from __future__ import annotations

import json
import os

import yaml

from rlcore.client.trainer import ForwardBackwardResult, OptimStepResult
from rlcore.core.config import load_config, resolve_stages
from rlcore.runtime import loop as loop_module
from rlcore.runtime.engine_link import RunContext
from rlcore.runtime.handles import Restored
from rlcore.runtime.loop import StageLoop

ROWS = 12


class FakeTrainer:
    """The calls a stage makes of its TrainerHandle, recorded; optimizer steps counted."""

    def __init__(self, resume_at: int | None = None):
        self.global_step = 0
        self.calls: list[tuple] = []
        self.resume_at = resume_at

    def configure(self, cfg, plan, model_path, stage_dir, total_steps) -> None:
        self.calls.append(("configure", total_steps))

    def forward_backward(self, sequences, loss: str) -> ForwardBackwardResult:
        self.calls.append(("forward_backward", len(sequences), loss))
        return ForwardBackwardResult(loss=1.0, metrics={"sft/loss": 1.0 / (self.global_step + 1)}, num_tokens=1)

    def optim_step(self) -> OptimStepResult:
        self.global_step += 1
        return OptimStepResult(grad_norm=0.5, lr=1e-3, global_step=self.global_step)

    def train_step(self, experiences) -> tuple[dict[str, float], int]:
        self.global_step += 1
        self.calls.append(("train_step", len(experiences)))
        return {"actor/loss": float(len(experiences))}, self.global_step

    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        self.calls.append(("save", self.global_step, explore_step, export_hf))
        return f"ckpt/global_step_{self.global_step}", ""

    def load_checkpoint(self) -> Restored | None:
        if self.resume_at is None:
            return None
        self.global_step = self.resume_at
        return Restored(f"ckpt/global_step_{self.resume_at}", self.resume_at, self.resume_at)


class Reporter:
    """The run's controller as the stage sees it: 'stop' once asked at `stop_at` or later."""

    def __init__(self, stop_at: int | None = None):
        self.stop_at, self.heartbeats = stop_at, []

    def record(self, stage, step, metrics) -> None:
        pass

    def heartbeat(self, stage, step, total_steps, policy_version, wait=True) -> str:
        self.heartbeats.append(step)
        return "stop" if self.stop_at is not None and step >= self.stop_at else "go"


def _stage(tmp_path, model_path: str, *overrides: str):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "response": str(i + 1)} for i in range(ROWS)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "model": {"model_path": model_path}, "checkpoint_root_dir": str(tmp_path), "monitor": {"monitor_type": ["jsonl"]},
        "mode": "train",
        "algorithm": {"algorithm_type": "sft"},
        "buffer": {"batch_size": 2, "total_epochs": 1, "explorer_input": {"taskset": {"path": str(tmp_path / "rows.jsonl")}}},
    }  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return resolve_stages(load_config(str(path), list(overrides)))[0]


def _run(tmp_path, model_path: str, trainer: FakeTrainer, reporter: Reporter | None = None, *overrides: str):
    stage = _stage(tmp_path, model_path, *overrides)
    sdir = str(tmp_path / "stage")
    os.makedirs(sdir, exist_ok=True)
    run = RunContext(run_dir=str(tmp_path), device="cpu", endpoints=[], reporter=reporter)
    summary = StageLoop(stage, sdir, model_path, trainer, run, is_last=True).run()  # type: ignore[arg-type]
    with open(os.path.join(sdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return summary, rows


def test_an_sft_stage_trains_every_row_once_logs_each_step_and_checkpoints_on_its_interval(tmp_path, tiny_model_path):
    trainer = FakeTrainer()
    summary, rows = _run(tmp_path, tiny_model_path, trainer, None, "trainer.save_interval=4")
    assert trainer.calls[0] == ("configure", ROWS // 2)
    assert [c[1:] for c in trainer.calls if c[0] == "forward_backward"] == [(2, "cross_entropy")] * (ROWS // 2)
    assert [r["step"] for r in rows] == list(range(1, ROWS // 2 + 1))
    assert all(r["actor/grad_norm"] == 0.5 for r in rows)
    # step 4 by the interval, step 6 as the stage's last (HF export: save_hf_checkpoint last)
    assert [c[1:] for c in trainer.calls if c[0] == "save"] == [(4, 4, False), (6, 6, True)]
    assert summary["global_step"] == ROWS // 2 and not summary["stopped"]
    assert summary["final_checkpoint"] == "ckpt/global_step_6"


def test_a_resumed_stage_takes_up_at_the_step_its_checkpoint_holds(tmp_path, tiny_model_path):
    trainer = FakeTrainer(resume_at=4)
    summary, rows = _run(tmp_path, tiny_model_path, trainer, None, "continue_from_checkpoint=true")
    assert len([c for c in trainer.calls if c[0] == "forward_backward"]) == ROWS // 2 - 4
    assert [r["step"] for r in rows] == [5, 6]
    assert summary["global_step"] == ROWS // 2


def test_a_stop_the_run_asks_for_ends_the_stage_after_the_step_with_a_checkpoint(tmp_path, tiny_model_path):
    trainer, reporter = FakeTrainer(), Reporter(stop_at=3)
    summary, rows = _run(tmp_path, tiny_model_path, trainer, reporter)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert summary["stopped"] and summary["global_step"] == 3
    assert [c[1:3] for c in trainer.calls if c[0] == "save"] == [(3, 3)]
    assert reporter.heartbeats[:3] == [1, 2, 3]


class FakeSource:
    """A step source that moves its explore step by two and runs dry after `dry_after` steps."""

    def __init__(self, trainer: FakeTrainer, dry_after: int):
        self.trainer, self.dry_after, self.taken = trainer, dry_after, []
        self.exhausted = False

    def step(self, explore_step: int, global_step: int) -> tuple[dict[str, float], int]:
        self.taken.append((explore_step, global_step))
        self.exhausted = len(self.taken) >= self.dry_after
        return self.trainer.train_step([None] * 3)

    def next_explore_step(self, explore_step: int) -> int:
        return explore_step + 2


def test_the_schedule_reads_where_the_source_says_and_ends_when_it_runs_dry(tmp_path, tiny_model_path, monkeypatch):
    trainer = FakeTrainer()
    sources: list[FakeSource] = []

    def fake_source(*args, **kwargs) -> FakeSource:
        sources.append(FakeSource(trainer, dry_after=2))
        return sources[-1]

    monkeypatch.setattr(loop_module, "step_source", fake_source)
    summary, rows = _run(tmp_path, tiny_model_path, trainer, None)
    assert sources[0].taken == [(0, 0), (2, 1)]
    assert [(r["step"], r["actor/loss"]) for r in rows] == [(1, 3.0), (2, 3.0)]
    assert [c[1:3] for c in trainer.calls if c[0] == "save"] == [(2, 4)]  # the final one, at explore step 4
    assert summary["global_step"] == 2

