"""A damaged newest checkpoint does not silently poison a resumed run: the resume names the damaged
file in one warning line, goes back to the previous checkpoint, drops the metrics logged past it,
and trains on exactly as a run that never stopped (the other kinds of damage are covered by
tests/unit/core/test_checkpoint_verify.py)."""

from __future__ import annotations

import os

import pytest

from tests.integration.launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _flip_a_byte(path: str) -> str:
    model = os.path.join(path, "model")
    victim = os.path.join(model, sorted(f for f in os.listdir(model) if f.endswith(".distcp"))[0])
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    return victim


def test_a_bit_flipped_checkpoint_is_named_and_the_run_resumes_from_the_previous_one(tmp_path) -> None:
    straight, damaged = str(tmp_path / "straight"), str(tmp_path / "damaged")
    settings = {"trainer.save_interval": 1, "trainer.save_hf_checkpoint": "never"}
    launch(tiny_grpo_config(straight, **{"buffer.total_steps": 4, **settings}), straight + ".yaml")
    cfg = tiny_grpo_config(damaged, **{"buffer.total_steps": 3, **settings})
    launch(cfg, damaged + ".yaml")
    run_dir = os.path.join(damaged, "it", "run")
    victim = _flip_a_byte(os.path.join(run_dir, "global_step_3"))

    proc = launch(cfg, damaged + ".yaml", "buffer.total_steps=4", "continue_from_checkpoint=true")
    output = proc.stdout + proc.stderr  # the ranks log to stdout
    warnings = [line for line in output.splitlines() if victim in line]
    assert len(warnings) == 1 and "differs from its checksum" in warnings[0], output[-3000:]
    assert f"resuming from {os.path.join(run_dir, 'global_step_2')}" in output

    rows = [m for m in read_metrics(run_dir) if "actor/loss" in m]
    reference = [m for m in read_metrics(os.path.join(straight, "it", "run")) if "actor/loss" in m]
    assert [m["step"] for m in rows] == [m["step"] for m in reference] == [1, 2, 3, 4]
    for a, b in zip(rows, reference, strict=True):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"], a["step"]
        assert a["actor/loss"] == pytest.approx(b["actor/loss"], abs=1e-6), a["step"]
