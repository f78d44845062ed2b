"""The step-pass plug point: an algorithm with a pass of its own (here a teacher, a second model that
scores each step's rows) is its pass's class plus the algorithm's line; the trainer calls the pass
at every point of a real step on the scratch model, in a one-rank gloo world, and never names it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import yaml

from rlcore.core import algorithms
from rlcore.core.algorithms import ALGORITHMS, Algorithm
from rlcore.core.algorithms.step_pass import PassContext, StepPass
from rlcore.core.config import load_config, resolve_stages
from rlcore.core.config.plan import filled
from rlcore.core.types import Experience
from rlcore.runtime.training import StageTraining

CALLS: list[str] = []


class TeacherPass(StepPass):
    """Scores each micro-batch with a frozen copy of the policy and adds its mean log-prob to the
    step's metrics; records the hooks the trainer called, in order."""

    name = "teacher"

    def __init__(self, ctx: PassContext):
        super().__init__(ctx)
        self.model = ctx.build_model(ctx.model_path, ctx.cfg.algorithm.optimizer)
        CALLS.append("init")

    def score(self, mbs):
        for mb, lp in zip(mbs, self.model.compute_logprobs(mbs, 1.0), strict=True):
            mb["teacher_logprobs"] = lp
        CALLS.append("score")

    def before_advantages(self, batch, rows):
        width = batch.response_mask.shape[1]
        self.teacher = rows.gather([mb["teacher_logprobs"] for mb in rows.micro_batches()], width)
        CALLS.append("before_advantages")

    def after_advantages(self, batch, rows, metrics):
        metrics["teacher/logprob_mean"] = float((self.teacher * batch.response_mask).sum() / batch.response_mask.sum())
        CALLS.append("after_advantages")

    def update(self, mbs, norm):
        CALLS.append("update")
        return {}


@pytest.fixture()
def world():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_an_algorithm_with_a_pass_of_its_own_runs_it_at_every_point_of_a_step(
    tiny_model_path, tmp_path, monkeypatch, world
) -> None:
    CALLS.clear()
    here = f"{__name__}:TeacherPass"
    monkeypatch.setitem(
        ALGORITHMS, "teacher_grpo", dataclasses.replace(ALGORITHMS["grpo"], passes=(here,))
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 4)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"model_path": tiny_model_path, "max_prompt_tokens": 8, "max_response_tokens": 4},
        "cluster": {"device": "cpu"},
        "algorithm": {"algorithm_type": "teacher_grpo", "repeat_times": 2},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": str(tasks)}}},
    }))  # fmt: skip
    stage = resolve_stages(load_config(str(path), []))[0]
    cfg, plan = filled(stage.config), stage.plan
    assert plan.passes.extra == (here,)
    assert isinstance(algorithms.algorithm_of(cfg.algorithm), Algorithm)

    training = StageTraining(cfg, str(tmp_path / "stage"), tiny_model_path, "cpu", 2, plan.passes)
    exps = [
        Experience([5, 6, 7], [8, 9, 10], [-1.0, -1.0, -1.0], reward=float(i % 2), group_id=f"g{i // 2}")
        for i in range(4)
    ]
    metrics = training.train_experiences(exps)
    assert CALLS == ["init", "score", "before_advantages", "after_advantages", "update"]
    assert metrics["teacher/logprob_mean"] < 0 and torch.isfinite(torch.tensor(metrics["teacher/logprob_mean"]))
    assert "actor/pg_loss" in metrics and training.state.global_step == 1
