"""Weights a mode-train launch publishes for the explorers of a decoupled run (mode explore), which
load them on their own time: no group and no call between the two launches, only a folder they
share.

    <folder>/version_N/     an HF export of the weights after optimizer step N (with the tokenizer),
                            written under version_N.tmp and renamed when complete
    <folder>/latest.json    {"version": N, "path": ..., "time": ...}, replaced atomically after the rename

The newest KEEP versions stay (an explorer may still be loading the one before the newest).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import torch.distributed as dist

from ..core.hf_export import export_hf
from ..core.rpc.cli import write_atomic
from .base import WeightSource, WeightTransport, drain

LATEST = "latest.json"
KEEP = 3


def latest_published(folder: str) -> tuple[int, str] | None:
    """(version, path) of the newest complete version in `folder`; None before the first."""
    try:
        with open(os.path.join(folder, LATEST)) as f:
            latest = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return int(latest["version"]), str(latest["path"])


def pin_newest(folder: str, pins: str, keep: int) -> str:
    """A copy, under `pins`, of the newest version in `folder` that its pruning cannot take away
    (hard links where `pins` is on the same filesystem, else copies): what a rollout worker that is
    (re)started mid-run loads, since the trainer may prune the version before the worker reads it.
    The newest `keep` pins stay (a worker may still be loading the one before)."""
    for _ in range(10):  # the version may be pruned while we link it: take the newer one
        latest = latest_published(folder)
        if latest is None:
            raise FileNotFoundError(f"no weights published in {folder} yet")
        version, path = latest
        pin = os.path.join(pins, os.path.basename(path))
        if not os.path.isdir(pin):
            shutil.rmtree(pin + ".tmp", ignore_errors=True)
            try:
                shutil.copytree(path, pin + ".tmp", copy_function=_link_or_copy)
            except (FileNotFoundError, shutil.Error):
                continue
            os.replace(pin + ".tmp", pin)
        for old in _versions(pins)[:-keep]:
            shutil.rmtree(os.path.join(pins, f"version_{old}"), ignore_errors=True)
        return pin
    raise RuntimeError(f"the weights in {folder} were pruned 10 times while being pinned to {pins}")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links refused
        shutil.copy2(src, dst)


def _versions(folder: str) -> list[int]:
    """The complete versions in `folder`, oldest first."""
    return sorted(int(n.removeprefix("version_")) for n in os.listdir(folder) if re.fullmatch(r"version_\d+", n))


class PublishTransport(WeightTransport):
    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        """Publish the weights of optimizer step `step` as version `step`. A version already there
        stays: a trainer resumed from a checkpoint publishes the same weights for the same step."""
        start = time.perf_counter()
        folder = self.endpoints.folder
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        path = os.path.join(folder, f"version_{step}")
        box = [os.path.isdir(path)]  # rank 0 decides for every rank: walking the weights is collective
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        self.version = step
        if box[0]:
            drain(source.iter_full_weights())
            return {}
        if rank0:
            shutil.rmtree(path + ".tmp", ignore_errors=True)
            os.makedirs(path + ".tmp")
        weights = source.iter_full_weights()
        export_hf(weights, path + ".tmp", source.hf_config(), self.endpoints.tokenizer_dir, write=rank0)
        if dist.is_initialized():
            dist.barrier()
        if not rank0:
            return {}
        os.replace(path + ".tmp", path)
        latest = latest_published(folder)
        if latest is None or latest[0] < step:
            latest_json = json.dumps({"version": step, "path": path, "time": time.time()})
            write_atomic(os.path.join(folder, LATEST), latest_json)
        for old in _versions(folder)[:-KEEP]:
            shutil.rmtree(os.path.join(folder, f"version_{old}"), ignore_errors=True)
        exported = sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".safetensors"))
        return {"num_bytes": float(exported), "total_s": time.perf_counter() - start}
