"""FSDP1 (`torch.distributed.fsdp.FullyShardedDataParallel`) training strategy.

`use_orig_params=True`, each decoder block its own FSDP unit (auto-wrapped by block class), the
root unit holds embeddings, final norm and LM head. Parameters stay float32 (master weights); with a
lower compute dtype MixedPrecision casts them for forward/backward and reduces gradients in float32.
Checkpoints are sharded through torch.distributed.checkpoint, like FSDP2's. Full tensors for weight
sync, HF export and gradient checks are gathered one unit at a time (a block with the LoRA factors
inside it), never the whole model.

With trainer.fsdp_config.param_offload the policy's flat parameters (so its gradients and the
optimizer's state and step) live on the CPU, and with trainer.offload_untrained_models the frozen
reference's: FSDP1's CPUOffload, which copies a unit's shard to the device for its forward and
backward. It needs an accelerator (torch refuses it on a CPU device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

from ...core.config.schema import LoraConfig, OptimizerConfig, TrainerConfig
from ...core.strategy_capabilities import CAPABILITIES
from ..common.dist_utils import rank_device
from ..common.hf_model import load_causal_lm, resolve_dtype, transformer_blocks
from ..common.lora import adapter_modules, trainable
from ..common.native import NativeStrategy, float16_scaler
from ..common.schedule import build_optimizer
from .units import UnitLayout


class FSDP1Strategy(NativeStrategy):
    capabilities = CAPABILITIES["fsdp"]

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
        self.offload = trainer_cfg.fsdp_config.param_offload
        if (self.offload or trainer_cfg.offload_untrained_models) and self.device.type == "cpu":
            raise ValueError(
                "trainer.fsdp_config.param_offload / offload_untrained_models: FSDP1's CPU offload needs a "
                "GPU (torch refuses it on a CPU device); use --strategy fsdp2 on a CPU, or set them false"
            )
        self.world_size = dist.get_world_size()
        self._sequence_parallel(trainer_cfg.ulysses_sequence_parallel_size)
        compute_dtype = resolve_dtype(dtype, self.device.type)
        # buffers (rotary frequencies) keep their dtype, as under FSDP2's MixedPrecisionPolicy
        self.mixed_precision = (
            MixedPrecision(param_dtype=compute_dtype, reduce_dtype=torch.float32)
            if compute_dtype != torch.float32
            else None
        )
        torch.manual_seed(seed)
        model = self._load(
            model_path, seed, trainer_cfg.gradient_checkpointing, lora, trainer_cfg.freeze_router
        )
        self._config = model.config
        blocks = transformer_blocks(model)
        # LoRA: each adapter factor is a unit of its own (a unit mixing frozen and trainable parameters
        # keeps gradients for all of them); inside a block it is gathered with the block
        own = adapter_modules(model, self.lora.adapter) if self.lora is not None else []
        in_blocks = {id(m) for b in blocks for m in b.modules()}
        self.layout = UnitLayout(model, blocks + [m for m in own if id(m) not in in_blocks])
        self.model = self._wrap(model, own, offload=self.offload)
        self._runs = self.layout.runs(self.model)
        for handle in self._frozen_units():
            handle._skip_writeback_check = True
        self.optimizer, self.scheduler = build_optimizer(
            trainable(self.model.parameters()), optimizer_cfg, total_steps
        )
        self.scaler = float16_scaler(compute_dtype, self.device)
        self.reference = None
        if with_reference and self.lora is None:  # LoRA's reference: the adapter switched off
            ref = self._prepared(load_causal_lm(model_path))
            ref.requires_grad_(False)
            self.reference = self._wrap(ref, offload=trainer_cfg.offload_untrained_models)

    def _wrap(
        self, model: torch.nn.Module, own: list[torch.nn.Module] | None = None, *, offload: bool = False
    ) -> FSDP:
        """FSDP units: every decoder block, and each module of `own`; the root holds the rest.
        `offload`: the flat parameters on the CPU (FSDP moves the CPU model to `device_id` to shard
        it, then the shards back)."""
        block_classes = {type(b) for b in transformer_blocks(model)}
        policy: ModuleWrapPolicy | CustomPolicy = ModuleWrapPolicy(block_classes)
        if own:
            ids = {id(m) for m in own}
            policy = CustomPolicy(lambda m: type(m) in block_classes or id(m) in ids)
        return FSDP(
            model if offload else model.to(self.device),
            auto_wrap_policy=policy,
            cpu_offload=CPUOffload(offload_params=offload),
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

    # On one rank FSDP1 does not shard, and a forward leaves a unit's parameters as plain tensor
    # views until its backward turns them back into parameters. A unit whose parameters are all
    # frozen (LoRA's base) never runs one: the next forward's write-back check would take those
    # tensors for the parameters themselves, and the state dict (checkpoints) would miss them (seen
    # with torch 2.13). Such a unit skips the check (it is never written to) and gets its parameter
    # views back before a state dict is taken; torch has no public call for either.

    def _frozen_units(self) -> list[Any]:
        if self.lora is None or self.world_size > 1:
            return []
        handles = [unit._handle for unit in FSDP.fsdp_modules(self.model)]
        return [h for h in handles if h is not None and not h.flat_param.requires_grad]

    def _parameter_views(self) -> None:
        for handle in self._frozen_units():
            handle._use_unsharded_views(as_params=True)

    def save_checkpoint(self, path: str) -> None:
        self._parameter_views()
        super().save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self._parameter_views()
        super().load_checkpoint(path)

    # ------------------------------------------------------------------ full tensors

    def _state(self, wanted: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        return self._iter_full(with_grads=False, wanted=wanted)

    def _state_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._iter_full(with_grads=True)

    def _iter_full(
        self, with_grads: bool, wanted: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Gather one FSDP unit at a time (the root alone; a block with any units nested in it) and
        yield copies of its entries in state-dict order; the unit is resharded before the next one is
        gathered.
        `wanted`: only the entries it accepts (a unit holding none is not gathered)."""
        scale = self._loss_scale()
        for unit, all_entries in self._runs:
            entries = all_entries if wanted is None else [e for e in all_entries if wanted(e.name)]
            if not entries:  # the same on every rank: the layout is
                continue
            # a block with its nested units (LoRA's factors); the root alone (not the whole model)
            recurse = unit is not self.model
            with FSDP.summon_full_params(unit, recurse=recurse, writeback=False, with_grads=with_grads):
                for e in entries:
                    tensor = getattr(e.module, e.attr)
                    if not with_grads:
                        yield e.name, tensor.detach().clone()
                    elif e.is_param:
                        grad = tensor.grad
                        # None: the loss does not reach it (the same on every rank)
                        yield e.name, torch.zeros_like(tensor) if grad is None else grad.detach() / scale

    def _state_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        # recorded before wrapping: the sharded parameters no longer show the full shapes
        return [(e.name, e.dtype, e.shape) for e in self.layout.entries]

    def hf_config(self) -> Any:
        return self._config
