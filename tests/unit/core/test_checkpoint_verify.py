"""Verified checkpoints: a manifest of every file's size and XXH3-64 (CRC-32 in older ones), written last; a resume skips a
damaged newest checkpoint (naming the file) for the previous good one; a save into a full file
system names ENOSPC and the path and leaves neither a partial folder nor a moved `latest`.

A real FSDP2 strategy on the tiny scratch model, in a one-rank gloo world."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest
import torch.distributed as dist

from rlcore.core.checkpoint import (
    MANIFEST,
    CheckpointError,
    TrainerState,
    resumable_checkpoint,
    save_checkpoint,
    step_dir,
    verify_checkpoint,
)
from rlcore.core.config.schema import OptimizerConfig, TrainerConfig


@pytest.fixture
def strategy(tmp_path, tiny_model_path):
    from rlcore.backends.fsdp2.strategy import FSDP2Strategy

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield FSDP2Strategy(
            tiny_model_path, TrainerConfig(), OptimizerConfig(), device="cpu", dtype="float32",
            total_steps=10, with_reference=False, seed=0,
        )  # fmt: skip
    finally:
        dist.destroy_process_group()


def _save(stage_dir: str, strategy, step: int) -> str:
    return save_checkpoint(stage_dir, strategy, TrainerState(global_step=step, explore_step=step), None)


def _some_model_file(path: str) -> str:
    model = os.path.join(path, "model")
    return os.path.join(model, sorted(f for f in os.listdir(model) if f.endswith(".distcp"))[0])


def test_a_saved_checkpoint_lists_every_file_in_its_manifest_and_verifies(tmp_path, strategy) -> None:
    path = _save(str(tmp_path / "stage"), strategy, 2)
    verify_checkpoint(path)
    with open(os.path.join(path, MANIFEST)) as f:
        listed = set(__import__("json").load(f)["files"])
    on_disk = {os.path.relpath(os.path.join(r, n), path) for r, _, ns in os.walk(path) for n in ns} - {
        MANIFEST
    }
    assert listed == on_disk and "trainer_state.json" in listed and "rng_rank0.pt" in listed
    assert resumable_checkpoint(str(tmp_path / "stage")) == path


def test_a_checkpoint_with_an_older_crc32_manifest_still_verifies(tmp_path, strategy) -> None:
    import json
    import zlib

    path = _save(str(tmp_path / "stage"), strategy, 2)
    with open(os.path.join(path, MANIFEST)) as f:
        manifest = json.load(f)
    assert manifest["format"] == 2 and all(len(m["xxh3_64"]) == 16 for m in manifest["files"].values())
    for rel, meta in manifest["files"].items():  # as checkpoints were written before XXH3
        with open(os.path.join(path, rel), "rb") as f:
            manifest["files"][rel] = {"size": meta["size"], "crc32": zlib.crc32(f.read())}
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump({**manifest, "format": 1}, f)
    verify_checkpoint(path)
    victim = _flip(path)
    with pytest.raises(CheckpointError, match=f"{victim} differs from its checksum"):
        verify_checkpoint(path)


def _truncate(path: str) -> str:
    victim = _some_model_file(path)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    return victim


def _delete(path: str) -> str:
    victim = os.path.join(path, "rng_rank0.pt")
    os.remove(victim)
    return victim


def _flip(path: str) -> str:
    victim = _some_model_file(path)
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    return victim


def _empty_state(path: str) -> str:
    victim = os.path.join(path, "trainer_state.json")
    open(victim, "w").close()
    return victim


@pytest.mark.parametrize("damage", [_truncate, _delete, _flip, _empty_state])
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_resumes(
    tmp_path, strategy, caplog, damage
) -> None:
    stage = str(tmp_path / "stage")
    older, newer = _save(stage, strategy, 2), _save(stage, strategy, 4)
    victim = damage(newer)
    with caplog.at_level(logging.WARNING, logger="rlcore.checkpoint"):
        assert resumable_checkpoint(stage) == older
    assert any(victim in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(CheckpointError, match="resume_fallback") as refused:
        resumable_checkpoint(stage, fallback=False)
    assert victim in str(refused.value) and "\n" not in str(refused.value)
    damage(older)
    with pytest.raises(CheckpointError, match="no checkpoint .* verifies"):
        resumable_checkpoint(stage)


def test_a_stage_without_checkpoints_resumes_from_nothing(tmp_path) -> None:
    assert resumable_checkpoint(str(tmp_path / "never")) is None


def test_a_save_into_a_full_file_system_names_enospc_and_leaves_nothing_behind(tmp_path, strategy) -> None:
    probe = _save(str(tmp_path / "probe"), strategy, 1)
    # what one checkpoint takes on a file system (blocks, not bytes: tmpfs rounds every file up)
    size = sum(os.stat(os.path.join(r, n)).st_blocks * 512 for r, _, ns in os.walk(probe) for n in ns)
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        stage = str(mount / "stage")
        first = _save(stage, strategy, 1)
        with pytest.raises(CheckpointError) as full:
            _save(stage, strategy, 2)
        message = str(full.value)
        assert "ENOSPC" in message and step_dir(stage, 2) in message and "\n" not in message, message
        assert sorted(os.listdir(stage)) == ["global_step_1", "latest"]
        with open(os.path.join(stage, "latest")) as f:
            assert f.read().strip() == os.path.basename(first)
        verify_checkpoint(first)
    finally:
        shutil.rmtree(str(mount / "stage"), ignore_errors=True)
        subprocess.run(["umount", str(mount)], check=True)
