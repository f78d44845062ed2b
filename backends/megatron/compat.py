"""What megatron-core 0.16.1 (the newest release Python 3.11 can install) leaves undefined without
TransformerEngine, defined here. Each fix checks for the gap first, so it does nothing on a release
that has closed it; when the minimum megatron-core moves past one, delete it.

- `megatron.core.transformer.moe.moe_utils` imports TransformerEngine's fused MoE ops in a `try`
  and binds none of their names when the import fails, but its router GEMM
  (`RouterGatingLinearFunction`) then tests `te_general_gemm is not None`: a NameError on the first
  MoE forward. Bound to None, it takes its own torch.mm path (the one it has for float64), and the
  other fused ops stay unused (rlcore sets no `moe_*_fusion`).
- Its all-to-all token dispatcher (`moe_token_dispatcher_type: alltoall`, expert parallelism) hands
  `torch.distributed.all_to_all_single` the split sizes as CPU tensors when no TransformerEngine
  kernel moved them to NumPy; torch 2.13's binding takes only a sequence of ints (TypeError:
  incompatible function arguments). The dispatcher's `all_to_all` is wrapped to pass them as lists.
- Its checkpoint writer (`dist_checkpointing.strategies.filesystem_async`) hands the written files
  back through a queue it makes on first use from a multiprocessing *spawn* Manager: a fresh
  interpreter that imports the rank's main module again, torch and rlcore with it (seconds of CPU
  and of wall time in every rank process's first save). rlcore saves synchronously, so the writing
  and the reading of those results both happen in the rank's own process, and a plain queue
  carries them (`checkpoint_results_in_process`).
- Its TransformerEngine-less norm (`WrappedTorchNorm`, the local layer spec's and the transformer
  block's final norm) refuses sequence parallelism, which a MoE layer beside tensor parallelism
  needs: sequence parallelism hands each tensor-parallel rank a slice of the tokens, so a norm's
  weight gets part of its gradient on each, and finalize_model_grads sums the parts of the weights
  tagged `sequence_parallel`, which WrappedTorchNorm does not tag (TENorm does). `SequenceParallelRMSNorm`
  is torch's RMSNorm with its weight tagged (`sequence_parallel_norms` puts it in the spec and the
  block's final norm).
- Its experts tag their weights for the expert-data-parallel reduction (`allreduce = False`) only
  when expert parallelism is > 1. With EP1 beside tensor parallelism, rlcore's layout keeps every
  expert whole on each TP rank (expert TP 1), and sequence parallelism hands each TP rank its own
  slice of the tokens: each rank's expert gradients are a part of the sum. Untagged, they were
  reduced over the data-parallel group only, which does not span the TP ranks (seen: expert
  gradients at 0.72-0.95 of HF's at TP2, everything else exact); tagged, the expert-data-parallel
  group (it does) sums them (`sum_expert_grads_over_tp`).
"""

from __future__ import annotations

import queue
from typing import Any

import torch

_TE_MOE_NAMES = (
    "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute", "fused_permute_with_probs",
    "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs", "fused_topk_with_score_function",
    "fused_unpermute", "te_general_gemm",
)  # fmt: skip


def moe_without_transformer_engine() -> None:
    """Bind TransformerEngine's MoE names that megatron-core left undefined to None, and pass the
    dispatcher's split sizes as lists (idempotent)."""
    from megatron.core.transformer.moe import moe_utils

    for name in _TE_MOE_NAMES:
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)
    moe_all_to_all_with_list_splits()


def _as_ints(splits: Any) -> Any:
    return splits.tolist() if hasattr(splits, "tolist") else splits


def _splits_as_lists(all_to_all: Any) -> Any:
    def wrapped(
        group: Any, input_: Any, output_split_sizes_: Any = None, input_split_sizes: Any = None
    ) -> Any:
        return all_to_all(group, input_, _as_ints(output_split_sizes_), _as_ints(input_split_sizes))

    wrapped.rlcore_compat = True  # type: ignore[attr-defined]
    return wrapped


def moe_all_to_all_with_list_splits() -> None:
    """Wrap the MoE token dispatcher's all_to_all to pass split sizes as lists (idempotent)."""
    from megatron.core.transformer.moe import token_dispatcher

    if not getattr(token_dispatcher.all_to_all, "rlcore_compat", False):
        token_dispatcher.all_to_all = _splits_as_lists(token_dispatcher.all_to_all)


def checkpoint_results_in_process() -> None:
    """Give megatron-core's checkpoint writer an in-process results queue before its first save
    makes a spawned Manager's (idempotent; for synchronous saves only, which are rlcore's)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", False) is None:
        filesystem_async._results_queue = queue.Queue()


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm, built as megatron-core builds a norm, its weight tagged for the sum over
    tensor-parallel ranks that sequence parallelism needs (the module docstring)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any):
        if config.normalization != "RMSNorm":
            raise ValueError(f"SequenceParallelRMSNorm is an RMSNorm; the config asks for {config.normalization}")
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]


def sequence_parallel_norms(spec: Any) -> Any:
    """`spec` (the local GPT layer spec) with SequenceParallelRMSNorm for its TE-less norms, and the
    transformer block's final norm too (idempotent; a release whose norm takes sequence parallelism
    is left as it is)."""
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    layer = spec.submodules
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(layer, name) is WrappedTorchNorm:
            setattr(layer, name, SequenceParallelRMSNorm)
    attention = layer.self_attention.submodules
    for name in ("q_layernorm", "k_layernorm"):
        if getattr(attention, name, None) is WrappedTorchNorm:
            setattr(attention, name, SequenceParallelRMSNorm)
    if transformer_block.LayerNormImpl is WrappedTorchNorm:
        transformer_block.LayerNormImpl = SequenceParallelRMSNorm
    return spec


def sum_expert_grads_over_tp(module: torch.nn.Module, config: Any) -> None:
    """Tag the expert weights of `module` for the expert-data-parallel reduction where tensor
    parallelism runs beside EP1 with experts whole on each TP rank (see the module's docstring);
    call before DistributedDataParallel and the optimizer read the tags. Idempotent."""
    folded = config.tensor_model_parallel_size > 1 and config.expert_tensor_parallel_size == 1
    if not folded or config.expert_model_parallel_size > 1:
        return
    for name, param in module.named_parameters():
        if ".experts." in name and getattr(param, "allreduce", True):
            param.allreduce = False  # type: ignore[attr-defined]
