"""sync_method checkpoint: the trainer ranks write an HF folder (rank 0 writes the files) that the
rollout workers load from a shared file system; no process group with the workers. A worker's half
loads the folder a request names (`receiver_half`; publish's explorers load theirs the same way)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..core.hf_export import export_hf
from .base import PendingUpdate, WeightSink, WeightSource, WeightTransport, announce


class CheckpointTransport(WeightTransport):
    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        start = time.perf_counter()
        sender = self.endpoints.sender
        failure: Exception | None = None
        box = [-1]  # the version, decided by rank 0; -1: nothing to deliver (every rank skips)
        if sender is not None:
            try:
                box[0] = announce(step, sender.served())
            except Exception as e:  # the workers do not answer: every rank must still agree
                failure = e
        dist.broadcast_object_list(box, src=0)
        if box[0] < 0:
            if failure is not None:
                raise failure
            return {}
        self.version = box[0]
        path = os.path.join(self.endpoints.folder, f"version_{self.version}")
        if sender is not None:
            os.makedirs(path, exist_ok=True)
        export_hf(
            source.iter_full_weights(), path, source.hf_config(), self.endpoints.tokenizer_dir,
            write=sender is not None,
        )  # fmt: skip
        dist.barrier()
        if sender is None:
            return {}
        sender.send_checkpoint(os.path.abspath(path), self.version)
        for name in os.listdir(self.endpoints.folder):  # the workers hold this version: older ones can go
            if name != os.path.basename(path):
                shutil.rmtree(os.path.join(self.endpoints.folder, name), ignore_errors=True)
        exported = sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".safetensors"))
        return {"num_bytes": float(exported), "total_s": time.perf_counter() - start}

    @staticmethod
    def receiver_half(
        sink: WeightSink, request: Any, update: PendingUpdate, joined: bool
    ) -> tuple[int, Callable[[], None]]:
        path = request.checkpoint_path

        def load() -> None:
            update.phase = f"loading {path}"
            start = time.perf_counter()
            sink.load_checkpoint(path, update.version)
            update.load_s = time.perf_counter() - start

        return 0, load
