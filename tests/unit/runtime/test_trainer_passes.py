"""Which step passes each kind of trainer runs: declared on the trainer classes, read by the config
check from plan.TRAINER_PASSES (torch-free), refused by one rule (shape_checks._check_trainer_passes)."""

from __future__ import annotations

import pytest

from rlcore.core.config.plan import TRAINER_PASSES, Passes, passes_refused
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
