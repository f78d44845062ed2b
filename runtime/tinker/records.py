"""What a Tinker server remembers of its training runs and checkpoints, and the RestClient's views of
them (training runs, their checkpoints, every checkpoint, weights info, deleting one).

A training run is a model a client created (`<session>:train:<n>`), with its spec; a checkpoint is
`tinker://<model_id>/weights/<name>` (training state: weights and optimizer) or
`tinker://<model_id>/sampler_weights/<name>` (an HF folder of the weights), whose checkpoint_id is
the part after the model id. Both are kept in `<workdir>/runs.json` and `<workdir>/checkpoints.json`,
so a restarted server lists and loads what an earlier one saved. Views show no server path.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from ...core.rpc.cli import write_atomic
from .access import sees
from .errors import NotFound, UserError

KINDS = {"weights": "training", "sampler_weights": "sampler"}
"""A tinker path's kind segment -> the RestClient's checkpoint_type."""


@dataclass
class ModelSpec:
    """What a training model is: its base model (by the served name) and its adapter."""

    base_model: str
    lora_rank: int
    """0: full fine-tuning."""
    train_attn: bool = True
    train_mlp: bool = True
    seed: int = 0
    train_unembed: bool = False
    """An adapter on the unembedding (lm_head) too; False in records of servers that did not train one."""


@dataclass
class Checkpoint:
    tinker_path: str
    kind: str
    """weights (a training checkpoint folder) or sampler_weights (an HF folder)."""
    folder: str
    model_id: str
    spec: ModelSpec
    time: float = field(default_factory=time.time)


@dataclass
class Run:
    spec: ModelSpec
    created: float = field(default_factory=time.time)
    owner: str = ""
    """The tenant that created it (access.py); "" in records of servers that kept none."""


class Records:
    """The server's training runs and checkpoints, on disk under `workdir`."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.lock = threading.Lock()
        self.checkpoints: dict[str, Checkpoint] = {
            r["tinker_path"]: Checkpoint(**{**r, "spec": ModelSpec(**r["spec"])})
            for r in self._read("checkpoints.json")
        }
        self.runs: dict[str, Run] = {
            r["model_id"]: Run(ModelSpec(**r["spec"]), r["created"], r.get("owner", "")) for r in self._read("runs.json")
        }
        for ckpt in sorted(self.checkpoints.values(), key=lambda c: c.time):  # a run an older server saved
            self.runs.setdefault(ckpt.model_id, Run(ckpt.spec, ckpt.time))
        self.last_request: dict[str, float] = {}

    def _read(self, name: str) -> list[dict[str, Any]]:
        try:
            with open(os.path.join(self.workdir, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return []

    def _write(self) -> None:
        """Both files, from the records as they are (called holding the lock)."""
        write_atomic(os.path.join(self.workdir, "checkpoints.json"),
                     json.dumps([asdict(c) for c in self.checkpoints.values()], indent=1))  # fmt: skip
        runs = [{"model_id": m, "spec": asdict(r.spec), "created": r.created, "owner": r.owner} for m, r in self.runs.items()]
        write_atomic(os.path.join(self.workdir, "runs.json"), json.dumps(runs, indent=1))

    # ------------------------------------------------------------------ what the service records

    def started(self, model_id: str, spec: ModelSpec, owner: str) -> None:
        with self.lock:
            if model_id not in self.runs:
                self.runs[model_id] = Run(spec, owner=owner)
                self._write()

    def owner(self, model_id: str) -> str:
        """The tenant of a training run ("" for one nobody owns, or none recorded)."""
        with self.lock:
            run = self.runs.get(model_id)
        return run.owner if run is not None else ""

    def touched(self, model_id: str) -> None:
        """A request of `model_id` arrived (the run's last_request_time)."""
        with self.lock:
            self.last_request[model_id] = time.time()

    def taken(self, path: str) -> bool:
        with self.lock:
            return path in self.checkpoints

    def record(self, ckpt: Checkpoint) -> None:
        with self.lock:
            self.checkpoints[ckpt.tinker_path] = ckpt
            self._write()

    def forget(self, path: str) -> bool:
        """Forget the checkpoint `path`; whether no other record names its folder (it may go)."""
        with self.lock:
            ckpt = self.checkpoints.pop(path)
            self._write()
            return all(c.folder != ckpt.folder for c in self.checkpoints.values())

    def forget_folder(self, folder: str) -> None:
        """Every record of the checkpoint in `folder` goes (its folder is being deleted)."""
        with self.lock:
            for path in [p for p, c in self.checkpoints.items() if c.folder == folder]:
                del self.checkpoints[path]
            self._write()

    def checkpoint(self, path: str, kind: str | None = None) -> Checkpoint:
        with self.lock:
            ckpt = self.checkpoints.get(path)
        if ckpt is None:
            raise NotFound(f"path: no checkpoint {path} on this server")
        if kind is not None and ckpt.kind != kind:
            raise UserError(f"path: {path} holds {ckpt.kind}, not {kind}")
        return ckpt

    def path_of(self, folder: str) -> str | None:
        with self.lock:
            return next((c.tinker_path for c in self.checkpoints.values() if c.folder == folder), None)

    # ------------------------------------------------------------------ the RestClient's views

    def training_run(self, model_id: str, caller: str) -> dict[str, Any]:
        with self.lock:
            run = self.runs.get(model_id)
            if run is None or not sees(run.owner, caller):
                raise NotFound(f"training_run_id: no training run {model_id} on this server")
            own = sorted((c for c in self.checkpoints.values() if c.model_id == model_id), key=lambda c: c.time)
            last = max([run.created, self.last_request.get(model_id, 0.0), *(c.time for c in own)])
        newest = {kind: next((c for c in reversed(own) if c.kind == kind), None) for kind in KINDS}
        return {
            "training_run_id": model_id, "base_model": run.spec.base_model, "model_owner": "rlcore",
            "is_lora": run.spec.lora_rank > 0, "corrupted": False, "lora_rank": run.spec.lora_rank or None,
            "last_request_time": _iso(last),
            "last_checkpoint": _view(newest["weights"]) if newest["weights"] else None,
            "last_sampler_checkpoint": _view(newest["sampler_weights"]) if newest["sampler_weights"] else None,
        }  # fmt: skip

    def training_runs(self, limit: int, offset: int, caller: str) -> dict[str, Any]:
        _check_page(limit, offset)
        with self.lock:
            ids = [m for m, r in self.runs.items() if sees(r.owner, caller)]
        ids.sort(key=lambda m: self.runs[m].created, reverse=True)
        return {
            "training_runs": [self.training_run(m, caller) for m in ids[offset : offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)},
        }

    def checkpoints_of(self, model_id: str, caller: str) -> dict[str, Any]:
        with self.lock:
            if model_id not in self.runs or not sees(self.runs[model_id].owner, caller):
                raise NotFound(f"training_run_id: no training run {model_id} on this server")
            own = sorted((c for c in self.checkpoints.values() if c.model_id == model_id), key=lambda c: c.time)
        return {"checkpoints": [_view(c) for c in own]}

    def all_checkpoints(self, limit: int, offset: int, caller: str) -> dict[str, Any]:
        _check_page(limit, offset)
        with self.lock:
            mine = [c for c in self.checkpoints.values() if sees(self.runs[c.model_id].owner if c.model_id in self.runs else "", caller)]
            every = sorted(mine, key=lambda c: c.time, reverse=True)
        return {
            "checkpoints": [_view(c) for c in every[offset : offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(every)},
        }

    def weights_info(self, path: str) -> dict[str, Any]:
        spec = self.checkpoint(path).spec
        lora = spec.lora_rank > 0
        return {
            "base_model": spec.base_model, "is_lora": lora, "lora_rank": spec.lora_rank or None,
            "train_unembed": spec.train_unembed if lora else None, "train_mlp": spec.train_mlp if lora else None,
            "train_attn": spec.train_attn if lora else None,
        }  # fmt: skip

    def find(self, model_id: str, checkpoint_id: str) -> Checkpoint:
        """The checkpoint `checkpoint_id` (`weights/<name>` or `sampler_weights/<name>`) of `model_id`."""
        kind = checkpoint_id.split("/", 1)[0]
        if kind not in KINDS or "/" not in checkpoint_id:
            raise UserError(f"checkpoint_id: '{checkpoint_id}' is not weights/<name> or sampler_weights/<name>")
        return self.checkpoint(f"tinker://{model_id}/{checkpoint_id}")


def _view(ckpt: Checkpoint) -> dict[str, Any]:
    """The RestClient's Checkpoint: no server path."""
    try:
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(ckpt.folder) for f in files) or None
    except OSError:  # deleted while listed (an unnamed sampler folder dropped)
        size = None
    return {
        "checkpoint_id": ckpt.tinker_path.split("/", 3)[3], "checkpoint_type": KINDS[ckpt.kind],
        "time": _iso(ckpt.time), "tinker_path": ckpt.tinker_path, "size_bytes": size, "public": False,
    }  # fmt: skip


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _check_page(limit: int, offset: int) -> None:
    if limit < 1:
        raise UserError(f"limit: must be >= 1; got {limit}")
    if offset < 0:
        raise UserError(f"offset: must be >= 0; got {offset}")
