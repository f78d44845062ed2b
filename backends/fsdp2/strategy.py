"""FSDP2 (`torch.distributed.fsdp.fully_shard`) training strategy.

Each decoder block is its own FSDP unit, the root holds embeddings, final norm and LM head.
Parameters stay float32 (master weights); with a lower compute dtype a MixedPrecisionPolicy casts
them for forward/backward and reduces gradients in float32. Checkpoints are sharded through
torch.distributed.checkpoint (DCP), so no rank ever holds the full optimizer state.

With trainer.fsdp_config.param_offload the policy's shards (parameters, gradients, and so the
optimizer's state and step) live on the CPU, and with trainer.offload_untrained_models the
reference's: FSDP2's CPUOffloadPolicy copies each block's parameters to the device for its forward
and backward. Collectives over CPU shards of a device mesh go through the device (the gradient
norm, full tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from ...core.config.schema import LoraConfig, OptimizerConfig, TrainerConfig
from ...core.strategy_capabilities import CAPABILITIES
from ..common.dist_utils import rank_device
from ..common.hf_model import load_causal_lm, resolve_dtype, transformer_blocks
from ..common.lora import trainable
from ..common.native import NativeStrategy, float16_scaler
from ..common.schedule import build_optimizer


class FSDP2Strategy(NativeStrategy):
    capabilities = CAPABILITIES["fsdp2"]

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
        head_bias: bool = True,
        lora: LoraConfig | None = None,
    ):
        assert not (value_head and with_reference), "a critic has no reference model"
        self.grad_clip, self.value_head, self.head_bias = trainer_cfg.grad_clip, value_head, head_bias
        self.packs_sequences = trainer_cfg.use_remove_padding
        self.device = rank_device(device)
        self.world_size = dist.get_world_size()
        self._sequence_parallel(trainer_cfg.ulysses_sequence_parallel_size)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        compute_dtype = resolve_dtype(dtype, self.device.type)
        self.mp_policy = (
            MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            if compute_dtype != torch.float32
            else MixedPrecisionPolicy()
        )
        torch.manual_seed(seed)
        self.offload = trainer_cfg.fsdp_config.param_offload
        model = self._load(
            model_path, seed, trainer_cfg.gradient_checkpointing, lora, trainer_cfg.freeze_router
        )
        self.model = self._shard(model, self.offload)
        self.optimizer, self.scheduler = build_optimizer(
            trainable(self.model.parameters()), optimizer_cfg, total_steps
        )
        self.scaler = float16_scaler(compute_dtype, self.device)
        self.reference = None
        if with_reference and self.lora is None:  # LoRA's reference: the adapter switched off
            ref = self._prepared(load_causal_lm(model_path))
            ref.requires_grad_(False)
            self.reference = self._shard(ref, trainer_cfg.offload_untrained_models)

    def _shard(self, model: torch.nn.Module, offload: bool) -> torch.nn.Module:
        """Each block its own FSDP unit, then the root; `offload`: the shards on the CPU (the model
        is not moved to the device first: FSDP moves what it computes with)."""
        policy = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if offload else OffloadPolicy()
        if not offload:
            model.to(self.device)
        for block in transformer_blocks(model):
            fully_shard(block, mesh=self.mesh, mp_policy=self.mp_policy, offload_policy=policy)
        fully_shard(model, mesh=self.mesh, mp_policy=self.mp_policy, offload_policy=policy)
        return model

    # ------------------------------------------------------------------ what differs from FSDP1

    def _gradient_sync(self, last: bool) -> AbstractContextManager:
        cast(FSDPModule, self.model).set_requires_gradient_sync(last)  # reduce-scatter after the last
        return nullcontext()

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        if not self.offload:
            return _full(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        # offloaded: each rank's gradient shards are CPU tensors of a device mesh; their squared
        # norms are summed over the ranks on the device, and the shards clipped where they are
        shards = [p.grad.to_local() for p in self.model.parameters() if isinstance(p.grad, DTensor)]
        local = torch.nn.utils.get_total_norm(shards).to(self.device)
        total = local.square()
        dist.all_reduce(total)
        norm = total.sqrt()
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0).cpu()  # torch's clip_grads_with_norm_ rule
        for shard in shards:
            shard.mul_(coef)
        return norm

    def policy_and_reference(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """Both sharded: FSDP2 leaves the root's parameters whole after a forward without backward
        (the reference's log-probs), and a blend must meet shard with shard."""
        policy, reference = super().policy_and_reference()
        for module in (policy, reference):
            cast(FSDPModule, module).reshard()
        return policy, reference

    # ------------------------------------------------------------------ full tensors

    def _state(self, wanted: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        if self.world_size == 1:
            # Every local shard is the whole tensor: views of the parameters, taken without autograd
            # (weight sync at 10M parameters spent more time here than on the wire).
            with torch.no_grad():
                views = [
                    (name, _full(t).detach())
                    for name, t in self.model.state_dict(keep_vars=True).items()
                    if wanted is None or wanted(name)
                ]
            yield from views
            return
        for name, tensor in self.model.state_dict().items():
            if wanted is None or wanted(name):  # the same names on every rank: a skip is collective
                yield name, _full(tensor).detach()

    def _state_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        # state_dict() order; remove_duplicate=False keeps a tied lm_head.weight, as state_dict() does
        params = dict(self.model.named_parameters(remove_duplicate=False))
        scale = self._loss_scale()
        for name in self.model.state_dict():
            if name not in params:  # a buffer: nothing to differentiate
                continue
            param, grad = params[name], params[name].grad
            if grad is None:  # the loss does not reach it (the same on every rank)
                yield name, torch.zeros(param.shape, dtype=param.dtype, device=self.device)
            else:
                full = _full(grad).detach()
                yield name, full / scale if scale != 1.0 else full

    def _state_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        # a DTensor reports its global shape: nothing is gathered here
        return [(name, t.dtype, tuple(t.shape)) for name, t in self.model.state_dict().items()]

    def hf_config(self) -> Any:
        return self.model.config


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a possibly sharded tensor. On a one-rank mesh the local shard already is the
    whole tensor: returned as it is (a view of the parameter), without a collective per tensor. An
    offloaded (CPU) shard of a device mesh is gathered on the device."""
    if not isinstance(tensor, DTensor):
        return tensor
    if tensor.device_mesh.size() == 1:
        return tensor.to_local()
    mesh = tensor.device_mesh
    if tensor.device.type != mesh.device_type:
        local = tensor.to_local().to(mesh.device_type)
        tensor = DTensor.from_local(
            local, mesh, tensor.placements, shape=tensor.shape, stride=tensor.stride()
        )
    return tensor.full_tensor()
