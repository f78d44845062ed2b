"""Whole HF tensors from a model sharded over tensor-, expert- and pipeline-parallel ranks: the source
of weight sync, HF export and gradients by HF name (MegatronStrategy.iter_full_weights / _grads)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from . import experts
from .mapping import ModelDims, hf_specs_of, megatron_names, megatron_to_hf, stage_of, to_local, tp_dim
from .model import layer_offset


class FullTensors:
    """This rank's view of one model's parallel layout (TP `tp`, PP `pp`, EP `ep` ranks)."""

    def __init__(
        self, module: torch.nn.Module, dims: ModelDims, tp: int, pp: int, ep: int, device: torch.device
    ):
        self.module, self.dims, self.tp, self.pp, self.ep, self.device = module, dims, tp, pp, ep, device
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()

    def from_stage(
        self, tensor: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, stage: int
    ) -> torch.Tensor:
        """`tensor` as held by pipeline stage `stage`, on every stage."""
        if self.pp == 1:
            assert tensor is not None
            return tensor
        if self.pp_rank != stage:
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
        assert tensor is not None
        tensor = tensor.contiguous()
        dist.broadcast(tensor, group=parallel_state.get_pipeline_model_parallel_group(), group_src=stage)
        return tensor

    def tensors(
        self, local_of: Callable[[torch.nn.Parameter], torch.Tensor], dtype: torch.dtype
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(hf_name, full tensor) for every weight, in `hf_specs` order, on every rank: each
        parameter is gathered over its TP group (a MoE layer's experts over the EP group) on the
        stage that owns it, converted to HF tensors there, and each of those is broadcast to the
        other stages — one parameter at a time. `local_of`: what of a parameter to gather (itself,
        or its gradient)."""
        params = dict(self.module.named_parameters())
        offset = layer_offset(self.dims)
        for name in megatron_names(self.dims):
            stage = stage_of(name, self.dims, self.pp)
            converted = None
            if stage == self.pp_rank:
                converted = megatron_to_hf(
                    name, self._shards(params, to_local(name, offset), local_of), self.dims
                )
            for i, (hf_name, shape) in enumerate(hf_specs_of(name, self.dims)):
                mine = None
                if converted is not None:
                    assert converted[i][0] == hf_name, (converted[i][0], hf_name)
                    mine = converted[i][1]
                yield hf_name, self.from_stage(mine, shape, dtype, stage)

    def _shards(
        self, params: dict[str, torch.nn.Parameter], local_name: str,
        local_of: Callable[[torch.nn.Parameter], torch.Tensor],
    ) -> list[torch.Tensor]:  # fmt: skip
        """What `megatron_to_hf` takes for one (local) name: its TP shards, or a MoE layer's
        experts stacked, all of them."""
        if experts.is_unit(local_name):
            count = self.dims.num_experts // self.ep
            local = torch.stack(
                [local_of(params[p]).detach() for p in experts.local_params(local_name, count)]
            )
            if self.ep == 1:
                return [local]
            parts = [torch.empty_like(local) for _ in range(self.ep)]
            dist.all_gather(parts, local, group=parallel_state.get_expert_model_parallel_group())
            return [torch.cat(parts)]
        local = local_of(params[local_name]).detach()
        if tp_dim(local_name, self.dims) is None or self.tp == 1:
            return [local]
        shards = [torch.empty_like(local) for _ in range(self.tp)]
        dist.all_gather(shards, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        return shards
