"""Checkpoints: `<stage_dir>/global_step_N/` holding the strategy's sharded model/optimizer/scheduler
state, the trainer state (step, data position, policy version, KL controller), every rank's RNG
states and, optionally, an HF-format export (`hf/`) and a LoRA adapter in peft's format (`adapter/`).

A checkpoint is written into `global_step_N.tmp/`; its manifest (`manifest.json`: every file's
size and CRC-32) is written last, then the folder is renamed, so a crash mid-save never leaves a
checkpoint that looks valid. `latest` names the newest complete one. A resume verifies the manifest
(`resumable_checkpoint`) and, when the newest checkpoint is damaged, says which file and falls back
to the previous good one. A save that fails (a full disk) names the path and the OS error, removes
its partial folder and leaves `latest` where it was.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import xxhash

STEP_DIR = re.compile(r"^global_step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
MANIFEST = "manifest.json"
_CHUNK = 8 << 20
_FULL_BELOW_BYTES = 1 << 20
"""A failed save with less free space than this left on its file system is reported as ENOSPC."""

log = logging.getLogger("rlcore.checkpoint")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read; str(e) is one line naming the file and the fix."""


@dataclass
class TrainerState:
    """Everything besides model/optimizer that a resumed run needs to continue identically."""

    global_step: int = 0
    """Optimizer steps taken."""
    explore_step: int = 0
    """Batches of tasks consumed (the data position)."""
    policy_version: int = 0
    """Version of the weights the engines hold."""
    kl_ctrl: dict[str, Any] = field(default_factory=dict)


def step_dir(stage_dir: str, step: int) -> str:
    return os.path.join(stage_dir, f"global_step_{step}")


def list_checkpoints(stage_dir: str) -> list[int]:
    """Steps of the checkpoints renamed into place (whether they verify is `verify_checkpoint`'s
    question), ascending."""
    if not os.path.isdir(stage_dir):
        return []
    steps = []
    for name in os.listdir(stage_dir):
        m = STEP_DIR.match(name)
        if m and os.path.isdir(os.path.join(stage_dir, name)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def resumable_checkpoint(stage_dir: str, fallback: bool = True) -> str | None:
    """The newest checkpoint that verifies; a damaged newer one is named in a warning (`fallback`)
    or raised (CheckpointError). None when the stage has no checkpoint; an error when it has some
    and none verifies."""
    steps = list_checkpoints(stage_dir)
    problems = []
    for step in reversed(steps):
        path = step_dir(stage_dir, step)
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            if not fallback:
                raise CheckpointError(
                    f"{e}; resume from the previous checkpoint with trainer.resume_fallback=true, or delete {path}"
                ) from None
            log.warning("%s; trying the previous checkpoint", e)
            problems.append(str(e))
            continue
        if problems:
            log.warning("resuming from %s, the newest checkpoint that verifies", path)
        return path
    if problems:
        raise CheckpointError(f"no checkpoint in {stage_dir} verifies (the newest: {problems[0]})")
    return None


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _xxh3(path: str) -> str:
    digest = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


CHECKSUMS = {"xxh3_64": _xxh3, "crc32": _crc32}
"""Checksum name -> function: manifests are written with xxh3_64 (23 GB/s in memory on these 2-core
machines against CRC-32's 4.1); those of earlier checkpoints, with crc32, still verify."""


def write_manifest(folder: str) -> None:
    """Record every file under `folder` with its size and XXH3-64 checksum (written last, atomically)."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, folder)
            if rel != MANIFEST:
                files[rel] = {"size": os.path.getsize(full), "xxh3_64": _xxh3(full)}
    tmp = os.path.join(folder, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": 2, "files": files}, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(folder, MANIFEST))


def verify_checkpoint(path: str) -> None:
    """Every file the manifest lists is there with its size and checksum (xxh3_64, or crc32 in
    manifests written before it); CheckpointError names the first that is not."""
    manifest = os.path.join(path, MANIFEST)
    try:
        with open(manifest) as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}: it was not written completely") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path}: {manifest} is damaged ({type(e).__name__}: {e})") from None
    for rel, meta in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise CheckpointError(f"checkpoint {path} is damaged: {full} is missing")
        size = os.path.getsize(full)
        if size != meta["size"]:
            raise CheckpointError(
                f"checkpoint {path} is damaged: {full} has {size} bytes, its manifest says {meta['size']}"
            )
        kind = next((k for k in CHECKSUMS if k in meta), None)
        if kind is None:
            raise CheckpointError(
                f"checkpoint {path}: {manifest} gives {rel} no checksum it knows ({', '.join(CHECKSUMS)})"
            )
        if CHECKSUMS[kind](full) != meta[kind]:
            raise CheckpointError(f"checkpoint {path} is damaged: {full} differs from its checksum")


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():  # this rank's GPU only: a resume may see another set of GPUs
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # the current device, which init_world chose


def save_checkpoint(
    stage_dir: str,
    strategy: Any,
    state: TrainerState,
    max_to_keep: int | None,
    export: Callable[[str], None] | None = None,
) -> str:
    """Collective: every rank calls it. Returns the final checkpoint folder; a failure on any rank
    is a CheckpointError on every rank, with the partial folder removed. `export(folder)` writes
    exports (an HF model in `hf/`, a LoRA adapter in `adapter/`) into the checkpoint's folder
    (collective)."""
    rank = dist.get_rank()
    final = step_dir(stage_dir, state.global_step)
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    _agree(final, tmp, lambda: os.makedirs(tmp) if rank == 0 else None)

    def write_rank_files() -> None:
        strategy.save_checkpoint(os.path.join(tmp, "model"))
        torch.save(_rng_state(), os.path.join(tmp, f"rng_rank{rank}.pt"))
        if export is not None:
            export(tmp)  # collective

    _agree(final, tmp, write_rank_files)

    def seal() -> None:  # rank 0, once every rank's files are there
        if rank != 0:
            return
        with open(os.path.join(tmp, TRAINER_STATE), "w") as f:
            json.dump(asdict(state), f, indent=2)
        write_manifest(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        latest = os.path.join(stage_dir, "latest")
        with open(latest + ".tmp", "w") as f:
            f.write(os.path.basename(final) + "\n")
        os.replace(latest + ".tmp", latest)

    _agree(final, tmp, seal)
    if rank == 0 and max_to_keep:
        for old in list_checkpoints(stage_dir)[:-max_to_keep]:
            shutil.rmtree(step_dir(stage_dir, old), ignore_errors=True)
    dist.barrier()
    return final


def _agree(final: str, tmp: str, work: Callable[[], None]) -> None:
    """Run this rank's part of a save, then agree across ranks: if any rank failed, rank 0 removes
    the partial folder and every rank raises the first failure as one CheckpointError."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    failure = None
    try:
        work()
    except (Exception, CheckpointException) as e:  # OS errors, and the strategies' wrappers of them
        failure = _describe_failure(final, e)
    failures: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(failures, failure)
    first = next((f for f in failures if f), None)
    if first is None:
        return
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    raise CheckpointError(first)


def _describe_failure(final: str, error: BaseException) -> str:
    """One line: the checkpoint, the OS error's name and text, and the file (when an OSError is
    somewhere in the chain, e.g. inside torch.distributed.checkpoint's wrapper), else the error."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.append(e)
        if isinstance(e, OSError) and e.errno:
            name = errno.errorcode.get(e.errno, str(e.errno))
            where = f" writing {e.filename}" if e.filename else ""
            return (
                f"cannot save checkpoint {final}: {name} ({os.strerror(e.errno)}){where}; "
                "free space there or set checkpoint_root_dir elsewhere, then resume with continue_from_checkpoint=true"
            )
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        for failure in getattr(e, "failures", {}).values():  # torch.distributed.checkpoint's per-rank errors
            todo += [
                x
                for x in (failure if isinstance(failure, tuple) else (failure,))
                if isinstance(x, BaseException)
            ]
    # torch.save's zip writer reports a full disk as "unexpected pos A vs B", without the OS error
    free = shutil.disk_usage(_existing_parent(final)).free
    if free < _FULL_BELOW_BYTES:
        return (
            f"cannot save checkpoint {final}: ENOSPC (No space left on device: {free} bytes free there); "
            "free space there or set checkpoint_root_dir elsewhere, then resume with continue_from_checkpoint=true"
        )
    return f"cannot save checkpoint {final}: {type(error).__name__}: {' '.join(str(error).split())[:300]}"


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def load_checkpoint(path: str, strategy: Any) -> TrainerState:
    """Collective: restore the strategy, this rank's RNG states, and return the trainer state."""
    rank = dist.get_rank()
    rng_file = os.path.join(path, f"rng_rank{rank}.pt")
    if not os.path.isfile(rng_file):
        raise ValueError(
            f"checkpoint {path} was written by fewer trainer ranks (no {os.path.basename(rng_file)}); "
            f"resume with the same cluster.num_nodes * cluster.ranks_per_node"
        )
    strategy.load_checkpoint(os.path.join(path, "model"))
    _set_rng_state(torch.load(rng_file, weights_only=False))
    with open(os.path.join(path, TRAINER_STATE)) as f:
        return TrainerState(**json.load(f))
