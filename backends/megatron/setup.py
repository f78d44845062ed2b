"""What a megatron strategy starts from: megatron-core's model-parallel groups and its optimizer's
settings (from rlcore's optimizer and trainer config)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig

from ...core.config.schema import OptimizerConfig, TrainerConfig
from ..common.schedule import FP16_INITIAL_LOSS_SCALE


def parallel_sizes(trainer_cfg: TrainerConfig) -> tuple[int, int, int, int]:
    """(tensor, pipeline, context, expert) parallel sizes, checked against the world (the
    data-parallel size is what remains)."""
    mcfg = trainer_cfg.megatron
    tp, pp, cp = (
        mcfg.tensor_model_parallel_size,
        mcfg.pipeline_model_parallel_size,
        mcfg.context_parallel_size,
    )
    ep = mcfg.expert_model_parallel_size
    world = dist.get_world_size()
    if world % (ep * pp):
        raise ValueError(
            f"trainer.megatron: expert_model_parallel_size * pipeline_model_parallel_size = {ep * pp} must "
            f"divide the number of trainer ranks ({world})"
        )
    if world % (tp * pp * cp):
        raise ValueError(
            f"trainer.megatron: tensor_model_parallel_size * pipeline_model_parallel_size * "
            f"context_parallel_size = {tp * pp * cp} must divide the number of trainer ranks ({world})"
        )
    if cp > 1 and not trainer_cfg.use_remove_padding:  # the config check refuses it first
        raise ValueError(
            "trainer.megatron.context_parallel_size: splits packed rows; set trainer.use_remove_padding=true"
        )
    return tp, pp, cp, ep


def model_parallel(tp: int, pp: int, cp: int, seed: int, ep: int = 1) -> None:
    """megatron-core's model-parallel groups for (tp, pp, cp, ep), formed again when an earlier
    stage's layout differs (the policy's, for a critic, is also its own), and its seeded RNG tracker."""
    if parallel_state.model_parallel_is_initialized() and (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
        parallel_state.get_context_parallel_world_size(),
        parallel_state.get_expert_model_parallel_world_size(),
    ) != (tp, pp, cp, ep):
        parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tp, pp, context_parallel_size=cp, expert_model_parallel_size=ep, expert_tensor_parallel_size=1
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def optimizer_config(
    optimizer_cfg: OptimizerConfig, trainer_cfg: TrainerConfig, dtype: torch.dtype, device: torch.device
) -> MegatronOptimizerConfig:
    offload = trainer_cfg.megatron.optimizer_offload_fraction
    if offload > 0 and (device.type != "cuda" or dtype == torch.float32):
        raise ValueError(
            f"trainer.megatron.optimizer_offload_fraction={offload}: megatron-core offloads the optimizer "
            f"of 16-bit parameters on a GPU only (here {dtype} on {device.type}); use model.dtype=bfloat16 "
            "on cuda, or set it 0"
        )
    return MegatronOptimizerConfig(
        optimizer="adam",
        lr=optimizer_cfg.lr,
        weight_decay=optimizer_cfg.weight_decay,
        adam_beta1=optimizer_cfg.betas[0],
        adam_beta2=optimizer_cfg.betas[1],
        adam_eps=optimizer_cfg.eps,
        clip_grad=trainer_cfg.grad_clip,
        use_distributed_optimizer=trainer_cfg.megatron.use_distributed_optimizer,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        initial_loss_scale=FP16_INITIAL_LOSS_SCALE,
        params_dtype=dtype,
        optimizer_cpu_offload=offload > 0,
        optimizer_offload_fraction=offload,
    )
