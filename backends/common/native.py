"""What the PyTorch-native strategies (FSDP1, FSDP2) share once their model is wrapped.

Both hold an HF module (`model`, and a frozen `reference` for KL), a torch AdamW with a LambdaLR
schedule, and DCP checkpoints; they differ only in how gradients synchronise across micro-batches,
how the global gradient norm is taken, and how full tensors are gathered.
"""

from __future__ import annotations

from abc import abstractmethod
from contextlib import AbstractContextManager

import torch

from ..base import Batch, LossFn, TrainingStrategy
from .dist_utils import all_reduce_sum
from .sharded_checkpoint import load_sharded, save_sharded
from .steps import accumulate_gradients, batch_logprobs, step_if_finite


class NativeStrategy(TrainingStrategy):
    model: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    device: torch.device
    world_size: int
    grad_clip: float

    @abstractmethod
    def _gradient_sync(self, last: bool) -> AbstractContextManager:
        """Context for one micro-batch's backward: reduce gradients across ranks only when `last`."""

    @abstractmethod
    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip to `max_norm`; return the global pre-clip norm as a plain tensor."""

    def forward_backward(
        self, micro_batches: list[Batch], loss_fn: LossFn, temperature: float
    ) -> dict[str, float]:
        # FSDP averages gradients over ranks; each loss is already this rank's share of the global
        # mean, so scaling by the world size turns the average back into the sum
        totals = accumulate_gradients(
            self.model, micro_batches, loss_fn, temperature, self.device, self.world_size, self._gradient_sync
        )
        return all_reduce_sum(totals, self.device)

    def optimizer_step(self) -> float:
        norm = self._clip_grad_norm(self.grad_clip if self.grad_clip > 0 else float("inf"))
        return step_if_finite(norm, self.optimizer, self.scheduler)

    def compute_logprobs(
        self, micro_batches: list[Batch], temperature: float, reference: bool = False
    ) -> list[torch.Tensor]:
        model = self.reference if reference else self.model
        assert model is not None, "compute_logprobs(reference=True) without a reference model"
        return batch_logprobs(model, micro_batches, temperature, self.device)

    def current_lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def save_checkpoint(self, path: str) -> None:
        save_sharded(path, self.model, self.optimizer, self.scheduler)

    def load_checkpoint(self, path: str) -> None:
        load_sharded(path, self.model, self.optimizer, self.scheduler)
