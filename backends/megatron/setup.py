"""What a megatron strategy starts from: megatron-core's model-parallel groups and its optimizer's
settings (from rlcore's optimizer and trainer config)."""

from __future__ import annotations

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig

from ...core.config.schema import OptimizerConfig, TrainerConfig
from ..common.schedule import FP16_INITIAL_LOSS_SCALE


def model_parallel(tp: int, pp: int, seed: int) -> None:
    """megatron-core's model-parallel groups for (tp, pp), formed again when an earlier stage's layout
    differs (the policy's, for a critic, is also its own), and its seeded RNG tracker."""
    if parallel_state.model_parallel_is_initialized() and (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    ) != (tp, pp):
        parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tp, pp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def optimizer_config(
    optimizer_cfg: OptimizerConfig, trainer_cfg: TrainerConfig, dtype: torch.dtype
) -> MegatronOptimizerConfig:
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
    )
