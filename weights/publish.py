"""Weights a mode-train launch publishes for the explorers of a decoupled run (mode explore), which
load them on their own time: no group and no call between the two launches, only a folder they
share.

    <folder>/version_N/     an HF export of the weights after optimizer step N (with the tokenizer),
                            written under version_N.tmp and renamed when complete
    <folder>/latest.json    {"version": N, "path": ..., "time": ...}, replaced atomically after the rename

The newest KEEP versions stay (an explorer may still be loading the one before the newest).

With plan.explorer_weights nccl the folder also holds what the two launches say to each other about
a process group (the first version is still a folder: the workers start from it):

    <folder>/receivers.json {"workers": [...], "holds": V}: the explorer's rollout workers, which hold
                            version V (-1: some hold older weights, e.g. a restarted one), and
                            receivers.token their launch's token (mode 0600)
    <folder>/pushed.json    {"version": N, "number": K}: the trainer pushed the weights of step N to
                            them as policy version K (a worker serving K or newer holds step N)
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
RECEIVERS = "receivers.json"
RECEIVERS_TOKEN = "receivers.token"
PUSHED = "pushed.json"


def latest_published(folder: str) -> tuple[int, str] | None:
    """(version, path) of the newest complete version in `folder`; None before the first."""
    latest = _read(os.path.join(folder, LATEST))
    return None if latest is None else (int(latest["version"]), str(latest["path"]))


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return dict(json.load(f))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def register_receivers(folder: str, workers: list[str], holds: int, token: str) -> None:
    """The explorer's side: the rollout workers a trainer pushes versions to, the version they all
    hold (-1 when some hold older weights), and their launch's token (mode 0600, beside)."""
    os.makedirs(folder, exist_ok=True)
    secret = os.path.join(folder, RECEIVERS_TOKEN)
    with open(os.open(secret + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(token)
    os.replace(secret + ".tmp", secret)
    write_atomic(os.path.join(folder, RECEIVERS), json.dumps({"workers": workers, "holds": holds, "time": time.time()}))


def unregister_receivers(folder: str) -> None:
    """The explorer's workers are gone (it finished): the trainer publishes folders again."""
    for name in (RECEIVERS, RECEIVERS_TOKEN):
        try:
            os.remove(os.path.join(folder, name))
        except FileNotFoundError:
            pass


def registered_receivers(folder: str) -> tuple[list[str], int, str]:
    """(the explorer's rollout workers, the version they all hold, their token); ([], -1, "")
    before it registers."""
    got = _read(os.path.join(folder, RECEIVERS))
    try:
        with open(os.path.join(folder, RECEIVERS_TOKEN)) as f:
            token = f.read()
    except FileNotFoundError:  # unregistered meanwhile
        return [], -1, ""
    return ([str(w) for w in got["workers"]], int(got["holds"]), token) if got else ([], -1, "")


def record_push(folder: str, version: int, number: int) -> None:
    """The trainer's side: the weights of step `version` reached the registered workers as policy
    version `number`."""
    write_atomic(os.path.join(folder, PUSHED), json.dumps({"version": version, "number": number, "time": time.time()}))


def last_push(folder: str) -> tuple[int, int] | None:
    """(step, policy version number) of the trainer's newest push; None before the first."""
    got = _read(os.path.join(folder, PUSHED))
    return (int(got["version"]), int(got["number"])) if got else None


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
