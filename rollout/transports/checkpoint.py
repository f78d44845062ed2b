"""sync_method checkpoint: the trainer ranks write an HF folder (rank 0 writes the files) that the
rollout workers load from a shared file system; no process group with the workers."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import torch.distributed as dist

from ...core.hf_export import export_hf
from .base import WeightSource, WeightTransport

if TYPE_CHECKING:
    from ..weight_sender import WeightSender


class CheckpointTransport(WeightTransport):
    def __init__(self, sender: WeightSender | None, folder: str, tokenizer_dir: str):
        """`folder`: where version folders are written (`<folder>/version_N`); `tokenizer_dir`: the
        model folder whose tokenizer files go with each export; `sender`: rank 0's link to the
        workers, None on the other ranks."""
        self.sender, self.folder, self.tokenizer_dir = sender, folder, tokenizer_dir
        if sender is not None:
            self.served = max(c.get_info().policy_version for c in sender.clients)

    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        box = [self.announce(step) if self.sender is not None else -1]
        dist.broadcast_object_list(box, src=0)  # every rank writes into rank 0's version folder
        path = os.path.join(self.folder, f"version_{box[0]}")
        writer = self.sender is not None
        if writer:
            os.makedirs(path, exist_ok=True)
        export_hf(source.iter_full_weights(), path, source.hf_config(), self.tokenizer_dir, write=writer)
        dist.barrier()
        if self.sender is None:
            return {}
        stats = self.sender.send_checkpoint(os.path.abspath(path), box[0])
        for name in os.listdir(self.folder):  # the workers hold this version now: older ones can go
            if name != os.path.basename(path):
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)
        stats["num_bytes"] = float(
            sum(e.stat().st_size for e in os.scandir(path) if e.name.endswith(".safetensors"))
        )
        return stats

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
