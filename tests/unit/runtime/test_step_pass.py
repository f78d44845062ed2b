"""The algorithm and step-pass plug points: an algorithm with a pass of its own (here a teacher, a
second model that scores each step's rows) is one module of the user's (tests/unit/algorithms/
user_parts.py) named by algorithm.algorithm_type; the trainer calls the pass at every point of a
real step on the scratch model, in a one-rank gloo world, and never names it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import yaml

from rlcore.core.config import load_config, resolve_stages
from rlcore.core.config.plan import filled
from rlcore.core.types import Experience
from rlcore.runtime.training import StageTraining
from tests.unit.algorithms import user_parts

PARTS = "tests.unit.algorithms.user_parts"


@pytest.fixture()
def world():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def one_step(tiny_model_path: str, tmp_path, algorithm: dict, **model: str) -> dict[str, float]:
    """One RL step of a validated stage with `algorithm` (and `model` keys) on four experiences in
    two groups."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 4)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"model_path": tiny_model_path, "max_prompt_tokens": 8, "max_response_tokens": 4, **model},
        "cluster": {"device": "cpu"},
        "algorithm": {"repeat_times": 2, **algorithm},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": str(tasks)}}},
    }))  # fmt: skip
    stage = resolve_stages(load_config(str(path), []))[0]
    training = StageTraining(filled(stage.config), str(tmp_path / "stage"), tiny_model_path, "cpu", 2, stage.plan.passes)
    exps = [
        Experience([5, 6, 7], [8, 9, 10], [-1.0, -1.0, -1.0], reward=float(i % 2), group_id=f"g{i // 2}")
        for i in range(4)
    ]
    metrics = training.train_experiences(exps)
    assert training.state.global_step == 1
    return metrics


def test_an_algorithm_of_ones_own_runs_its_pass_at_every_point_of_a_step(tiny_model_path, tmp_path, world) -> None:
    user_parts.CALLS.clear()
    metrics = one_step(tiny_model_path, tmp_path, {"algorithm_type": f"{PARTS}:TEACHER_GRPO"})
    assert user_parts.CALLS == ["init", "score", "before_advantages", "after_advantages", "update"]
    assert metrics["teacher/logprob_mean"] < 0 and torch.isfinite(torch.tensor(metrics["teacher/logprob_mean"]))
    assert "actor/pg_loss" in metrics


def test_an_advantage_and_a_policy_loss_of_ones_own_train_a_step(tiny_model_path, tmp_path, world) -> None:
    """advantage_fn and policy_loss_fn by import path: checked at validate time (one call each on a
    small batch), then the step calls them; the policy loss is -A log pi with A the centred reward."""
    user_parts.CALLS.clear()
    metrics = one_step(tiny_model_path, tmp_path, {
        "advantage_fn": f"{PARTS}:centred", "policy_loss_fn": f"{PARTS}:vanilla_pg", "kl_loss_coef": 0.0,
    })  # fmt: skip
    assert user_parts.CALLS == ["centred", "vanilla_pg", "centred", "vanilla_pg"]  # validate, then the step
    assert metrics["actor/pg_clipfrac"] == 0.0 and torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))


def test_on_policy_distillation_learns_the_teachers_reverse_kl(tiny_model_path, tmp_path, world) -> None:
    """on_policy_distill: a frozen teacher (the scratch model with another seed, the same tokenizer)
    scores the step's tokens; with the student itself as the teacher the reverse KL is 0 and so is
    every advantage (nothing to learn), with another it is not."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    other = str(tmp_path / "teacher")
    build_scratch_model(other, ScratchModelConfig(enabled=True), max_model_len=256, seed=1)
    algo = {"algorithm_type": "on_policy_distill", "kl_loss_coef": 0.0}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same = one_step(tiny_model_path, tmp_path / "a", algo, teacher_model_path=tiny_model_path)
    assert same["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6) and same["distill/coef"] == 1.0
    assert same["actor/pg_loss"] == pytest.approx(0.0, abs=1e-6)
    taught = one_step(tiny_model_path, tmp_path / "b", algo, teacher_model_path=other)
    assert abs(taught["distill/reverse_kl"]) > 1e-2 and taught["actor/pg_loss"] != 0.0
