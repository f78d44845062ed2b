"""FSDP1 (`torch.distributed.fsdp.FullyShardedDataParallel`) training strategy.

`use_orig_params=True`, each decoder block its own FSDP unit (auto-wrapped by block class), the
root unit holds embeddings, final norm and LM head. Parameters stay float32 (master weights); with a
lower compute dtype MixedPrecision casts them for forward/backward and reduces gradients in float32.
Checkpoints are sharded through torch.distributed.checkpoint, like FSDP2's. Full tensors for weight
sync, HF export and gradient checks are gathered one unit at a time, never the whole model (and
never with CPU offload, which segfaults on CPU-resident parameters).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ...core.config.schema import OptimizerConfig, TrainerConfig
from ..common.dist_utils import rank_device
from ..common.hf_model import load_causal_lm, resolve_dtype, transformer_blocks
from ..common.native import NativeStrategy, float16_scaler
from ..common.schedule import build_optimizer
from .units import UnitLayout


class FSDP1Strategy(NativeStrategy):
    def __init__(
        self,
        model_path: str,
        trainer_cfg: TrainerConfig,
        optimizer_cfg: OptimizerConfig,
        *,
        device: str,
        dtype: str,
        total_steps: int,
        with_reference: bool,
        seed: int,
        value_head: bool = False,
    ):
        assert not (value_head and with_reference), "a critic has no reference model"
        self.grad_clip, self.value_head = trainer_cfg.grad_clip, value_head
        self.device = rank_device(device)
        self.world_size = dist.get_world_size()
        compute_dtype = resolve_dtype(dtype, self.device.type)
        # buffers (rotary frequencies) keep their dtype, as under FSDP2's MixedPrecisionPolicy
        self.mixed_precision = (
            MixedPrecision(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            if compute_dtype != torch.float32
            else None
        )
        torch.manual_seed(seed)
        model = self._load(model_path, seed, trainer_cfg.gradient_checkpointing)
        self._config = model.config
        self.layout = UnitLayout(model, transformer_blocks(model))
        self.model = self._wrap(model)
        self._runs = self.layout.runs(self.model)
        self.optimizer, self.scheduler = build_optimizer(self.model.parameters(), optimizer_cfg, total_steps)
        self.scaler = float16_scaler(compute_dtype, self.device)
        self.reference = None
        if with_reference:
            ref = load_causal_lm(model_path)
            ref.requires_grad_(False)
            self.reference = self._wrap(ref)

    def _wrap(self, model: torch.nn.Module) -> FSDP:
        block_classes = {type(b) for b in transformer_blocks(model)}
        return FSDP(
            model.to(self.device),
            auto_wrap_policy=ModuleWrapPolicy(block_classes),
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            mixed_precision=self.mixed_precision,
            device_id=self.device,
            use_orig_params=True,
        )

    # ------------------------------------------------------------------ what differs from FSDP2

    def _gradient_sync(self, last: bool) -> AbstractContextManager:
        # no_sync keeps unsharded gradients locally; the last micro-batch reduce-scatters them all
        return nullcontext() if last else cast(FSDP, self.model).no_sync()

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return cast(FSDP, self.model).clip_grad_norm_(max_norm)  # the global norm over all shards

    # ------------------------------------------------------------------ full tensors

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._iter_full(with_grads=False)

    def iter_full_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._iter_full(with_grads=True)

    def _iter_full(self, with_grads: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """Gather one FSDP unit at a time (recurse=False: only its own parameters) and yield copies of
        its entries in state-dict order; the unit is resharded before the next one is gathered."""
        scale = self._loss_scale()
        for unit, entries in self._runs:
            with FSDP.summon_full_params(unit, recurse=False, writeback=False, with_grads=with_grads):
                for e in entries:
                    tensor = getattr(e.module, e.attr)
                    if not with_grads:
                        yield e.name, tensor.detach().clone()
                    elif e.is_param:
                        grad = tensor.grad
                        # None: the loss does not reach it (the same on every rank)
                        yield e.name, torch.zeros_like(tensor) if grad is None else grad.detach() / scale

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        # recorded before wrapping: the sharded parameters no longer show the full shapes
        return [(e.name, e.dtype, e.shape) for e in self.layout.entries]

    def hf_config(self) -> Any:
        return self._config
