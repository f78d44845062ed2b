"""Which step passes each kind of trainer runs: declared on the trainer classes, read by the config
check from plan.TRAINER_PASSES (torch-free), refused by one rule (shape_checks._check_trainer_passes)."""

from __future__ import annotations

import pytest

from rlcore.core.config.plan import TRAINER_PASSES, Passes, passes_refused
from rlcore.core.config.shape_checks import pass_refusal
from rlcore.runtime.handles import LocalTrainer, RemoteTrainer
from rlcore.runtime.tinker.trainer import TinkerTrainer


def test_the_table_is_what_each_trainer_class_declares() -> None:
    assert LocalTrainer.runs_passes is None and RemoteTrainer.runs_passes is None  # rlcore's own: every pass
    assert TRAINER_PASSES == {"tinker": TinkerTrainer.runs_passes}


@pytest.mark.parametrize(
    ("passes", "refused"),
    [
        (Passes(False, True, False, False, (), False), []),
        (Passes(True, True, False, False, (), False), ["reference"]),
        (Passes(False, True, True, True, ("critic",), False), ["correction", "routing_replay", "critic"]),
    ],
)
def test_a_tinker_service_runs_only_the_old_logprob_pass(passes: Passes, refused: list[str]) -> None:
    assert passes_refused("tinker", passes) == refused
    assert passes_refused("local", passes) == [] and passes_refused("remote", passes) == []


def test_distilling_on_a_tinker_service_is_refused_naming_the_teacher_and_its_key(
    recipe: str, tiny_model_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The teacher pass of GRPO with algorithm.distill_coef (not an algorithm of its own) says which
    key turns it off."""
    from rlcore.cli.main import main

    tinker = ["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.kl_loss_coef=0"]
    distill = ["algorithm.distill_coef=0.5", f"model.teacher_model_path={tiny_model_path}"]
    assert main(["config", "validate", recipe, *tinker, *distill]) == 2
    assert capsys.readouterr().err.strip() == (
        "rlcore: error: trainer.remote tinker://h:1 (a Tinker service) runs no teacher pass (a teacher's log-probs, "
        "on-policy distillation: set algorithm.distill_coef 0, or train with rlcore's trainer)"
    )
    assert pass_refusal("x", "critic", "ppo") == (
        "x runs no critic pass (algorithm_type ppo's own, beside the policy: train it with rlcore's trainer)"
    )
