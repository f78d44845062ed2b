"""FSDP2 (`torch.distributed.fsdp.fully_shard`) training strategy.

Each decoder block is its own FSDP unit, the root holds embeddings, final norm and LM head.
Parameters stay float32 (master weights); with a lower compute dtype a MixedPrecisionPolicy casts
them for forward/backward and reduces gradients in float32. Checkpoints are sharded through
torch.distributed.checkpoint (DCP), so no rank ever holds the full optimizer state.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ...core.config.schema import OptimizerConfig, TrainerConfig
from ..base import Batch, LossFn, TrainingStrategy
from ..common.hf_model import forward_logprobs, load_causal_lm, resolve_dtype, transformer_blocks
from ..common.schedule import build_optimizer


class FSDP2Strategy(TrainingStrategy):
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
    ):
        self.cfg = trainer_cfg
        self.device = (
            torch.device(device, int(os.environ.get("LOCAL_RANK", 0)))
            if device == "cuda"
            else torch.device("cpu")
        )
        self.world_size = dist.get_world_size()
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        compute_dtype = resolve_dtype(dtype, self.device.type)
        self.mp_policy = (
            MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            if compute_dtype != torch.float32
            else MixedPrecisionPolicy()
        )
        torch.manual_seed(seed)
        self.model = self._shard(load_causal_lm(model_path, trainer_cfg.gradient_checkpointing))
        self.optimizer, self.scheduler = build_optimizer(self.model.parameters(), optimizer_cfg, total_steps)
        self.reference = None
        if with_reference:
            ref = load_causal_lm(model_path)
            ref.requires_grad_(False)
            self.reference = self._shard(ref)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        model.to(self.device)
        for block in transformer_blocks(model):
            fully_shard(block, mesh=self.mesh, mp_policy=self.mp_policy)
        fully_shard(model, mesh=self.mesh, mp_policy=self.mp_policy)
        return model

    # ------------------------------------------------------------------ training

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def forward_backward(
        self, micro_batches: list[Batch], loss_fn: LossFn, temperature: float
    ) -> dict[str, float]:
        self.model.train()
        totals: dict[str, float] = defaultdict(float)
        for i, mb in enumerate(micro_batches):
            mb = self._to_device(mb)
            # Reduce-scatter gradients only after the last micro-batch.
            cast(FSDPModule, self.model).set_requires_gradient_sync(i == len(micro_batches) - 1)
            logprobs, entropy = forward_logprobs(self.model, mb, temperature, loss_fn.needs_entropy)
            loss, metrics = loss_fn(logprobs, entropy, mb)
            # FSDP averages gradients over ranks; the loss is already this rank's share of the
            # global mean, so scale the average back to a sum.
            (loss * self.world_size).backward()
            for k, v in metrics.items():
                totals[k] += v
        return _all_reduce_sum(totals, self.device)

    def optimizer_step(self) -> float:
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        grad_norm = float(norm)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm

    @torch.no_grad()
    def compute_logprobs(
        self, micro_batches: list[Batch], temperature: float, reference: bool = False
    ) -> list[torch.Tensor]:
        model = self.reference if reference else self.model
        assert model is not None, "compute_logprobs(reference=True) without a reference model"
        out = []
        for mb in micro_batches:
            logprobs, _ = forward_logprobs(model, self._to_device(mb), temperature, with_entropy=False)
            out.append(logprobs.float().cpu())
        return out

    def current_lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    # ------------------------------------------------------------------ state

    def save_checkpoint(self, path: str) -> None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        if dist.get_rank() == 0:
            torch.save({"scheduler": self.scheduler.state_dict()}, os.path.join(path, "scheduler.pt"))
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        extra = torch.load(os.path.join(path, "scheduler.pt"), weights_only=True)
        self.scheduler.load_state_dict(extra["scheduler"])

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.model.state_dict().items():
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            yield name, full.detach()

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        # a DTensor reports its global shape: nothing is gathered here
        return [(name, t.dtype, tuple(t.shape)) for name, t in self.model.state_dict().items()]

    def hf_config(self) -> Any:
        return self.model.config


def _all_reduce_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    if not values:
        return {}
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))
