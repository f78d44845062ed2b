"""Building megatron-core GPTModels from a HF model folder, and loading/reading their weights.

The model is the local (non-TransformerEngine) layer spec: RMSNorm, SwiGLU MLP, rotary positions,
optional QKV bias (Qwen2), optional query/key RMSNorms (Qwen3), tied or untied output layer — the
Llama, Qwen2 and Qwen3 families — and for Qwen3-MoE a MoE layer in every MLP's place (a softmax
top-k router, SequentialMLP experts split over the expert-parallel ranks; no load-balancing loss). A critic
(`ModelDims.value_head`) has a scalar head (`ValueHead`) in the output layer's place.
"""

from __future__ import annotations

import json
import os
from collections import ChainMap
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, cast

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from safetensors import safe_open

from ..common.hf_model import VALUE_HEAD, value_head_init
from . import compat, experts
from .mapping import ModelDims, hf_to_megatron, padded_vocab, stage_layers, to_global


def transformer_config(
    dims: ModelDims,
    tp: int,
    pp: int,
    dtype: torch.dtype,
    on_cpu: bool,
    recompute: bool,
    cp: int = 1,
    ep: int = 1,
) -> TransformerConfig:
    """Everything numerically relevant matches the HF model: no dropout, fp32 softmax, the HF eps.
    Fused kernels are off (they need Apex/TransformerEngine); losses are summed, not averaged, by
    the pipeline schedule because rlcore's loss functions normalise globally themselves."""
    return TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden,
        num_attention_heads=dims.num_heads,
        num_query_groups=dims.num_kv_heads,
        kv_channels=dims.head_dim,
        ffn_hidden_size=dims.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=dims.rms_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        qk_layernorm=dims.qk_norm,  # also what makes finalize_model_grads sum their grads over TP
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=tp,
        sequence_parallel=tp > 1 and bool(dims.num_experts),
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        cp_comm_type="all_gather" if cp > 1 else None,  # what context_parallel.attend does
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        calculate_per_token_loss=True,
        use_cpu_initialization=on_cpu,
        # Every weight is then overwritten from the HF checkpoint, but initialisation is also where
        # megatron-core tags tensor-parallel weights; untagged, they count once per TP rank as
        # "duplicates" and the grad norm (and clipping) silently misses them.
        perform_initialization=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
        **_moe_config(dims, ep),
    )


def _moe_config(dims: ModelDims, ep: int) -> dict[str, Any]:
    """A Qwen3-MoE layer as transformers computes it: softmax over every expert's logit, the top k
    kept (renormalised when norm_topk_prob: the softmax of the top k logits, which is how
    megatron-core computes it without pre-softmax), no token dropped, no auxiliary loss."""
    if not dims.num_experts:
        return {}
    compat.moe_without_transformer_engine()
    return {
        "num_moe_experts": dims.num_experts,
        "moe_router_topk": dims.experts_per_token,
        "moe_ffn_hidden_size": dims.moe_ffn,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not dims.norm_topk_prob,
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "alltoall",
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": 1,
    }


def build_gpt(
    config: TransformerConfig,
    dims: ModelDims,
    first_stage: bool | None = None,
    last_stage: bool | None = None,
    packed: bool = False,
) -> GPTModel:
    """This rank's part of the model: its pipeline stage's layers, its tensor-parallel slices (the
    stage position defaults to this rank's in parallel_state). `packed`: its attention also takes
    packed sequences (packing.py)."""
    if first_stage is None:
        first_stage = parallel_state.is_pipeline_first_stage()
    if last_stage is None:
        last_stage = parallel_state.is_pipeline_last_stage()
    model = GPTModel(
        config,
        layer_spec(dims, packed),
        vocab_size=padded_vocab(dims.vocab, config.tensor_model_parallel_size),
        max_sequence_length=dims.max_positions,
        pre_process=first_stage,
        post_process=last_stage,
        share_embeddings_and_output_weights=dims.tied and not dims.value_head,
        position_embedding_type="rope",
        rotary_base=int(dims.rope_theta),
    )
    if dims.value_head and last_stage:
        model.output_layer = ValueHead(dims.hidden, dims.head_bias)
    return model


def layer_spec(dims: ModelDims, packed: bool = False) -> ModuleSpec:
    """megatron-core's local GPT layer spec (RMSNorm; query/key norms for Qwen3; MoE layers for
    Qwen3-MoE); `packed`: its core attention also takes packed sequences (packing.py)."""
    spec = compat.sequence_parallel_norms(
        get_gpt_layer_local_spec(
            num_experts=dims.num_experts or None, normalization="RMSNorm", qk_layernorm=dims.qk_norm
        )
    )
    if packed:
        from .packing import PackedDotProductAttention

        spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    return spec


class ValueHead(torch.nn.Module):
    """A critic's output layer, in GPTModel's `output_layer` place and called as it calls that: one
    value per position, HF's token-classification head (`score`: weight [1, H], bias [1]). Its
    parameters keep the output layer's names (`output_layer.weight`, `.bias`), which GPTModel's
    checkpointing expects. It is replicated, not tensor-parallel: every TP rank holds the same full
    hidden states after the final norm, so each computes the same values and the full gradient of
    the trunk's output, which therefore needs no all-reduce (the vocabulary-parallel output layer
    needs one because its ranks' logits differ); its gradient norm counts once, as for every
    replicated weight."""

    def __init__(self, hidden: int, bias: bool = True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden))
        self.bias = torch.nn.Parameter(torch.zeros(1)) if bias else None  # a reward model's has none

    def forward(
        self,
        hidden_states: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, None]:
        return F.linear(hidden_states, self.weight, self.bias), None


class HFWeights(Mapping[str, torch.Tensor]):
    """The tensors of a HF model folder's safetensors files, read one at a time on access."""

    def __init__(self, model_path: str):
        index = os.path.join(model_path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = json.load(f)["weight_map"]
            self._file_of = {name: os.path.join(model_path, file) for name, file in files.items()}
        else:
            single = os.path.join(model_path, "model.safetensors")
            if not os.path.exists(single):
                raise ValueError(f"model.model_path: no safetensors weights in {model_path}")
            with safe_open(single, "pt") as f:
                self._file_of = {name: single for name in f.keys()}

    def __getitem__(self, name: str) -> torch.Tensor:
        with safe_open(self._file_of[name], "pt") as f:
            return f.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)


def with_value_head(hf: Mapping[str, torch.Tensor], dims: ModelDims, seed: int) -> Mapping[str, torch.Tensor]:
    """A value model's HF weights with the scalar head it lacks: a causal LM's folder gets a fresh
    head (value_head_init), a reward model's export (no bias) a critic's bias 0. Read-only lookups."""
    weight_name, bias_name = VALUE_HEAD + ".weight", VALUE_HEAD + ".bias"
    added: dict[str, torch.Tensor] = {}
    if weight_name not in hf:
        weight, bias = value_head_init(dims.hidden, seed)
        added = {weight_name: weight, bias_name: bias}
    elif dims.head_bias and bias_name not in hf:
        added = {bias_name: torch.zeros(1)}
    if not dims.head_bias:
        added.pop(bias_name, None)
    return ChainMap(added, cast(MutableMapping[str, torch.Tensor], hf)) if added else hf


def layer_offset(dims: ModelDims) -> int:
    """Global index of this pipeline stage's first layer (stages number their layers from 0)."""
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    return stage_layers(dims, pp, parallel_state.get_pipeline_model_parallel_rank()).start


@torch.no_grad()
def load_hf_weights(model: GPTModel, hf: Mapping[str, torch.Tensor], dims: ModelDims) -> None:
    """Copy this rank's shard of every parameter from the HF tensors (a MoE layer's experts: this
    expert-parallel rank's)."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep = parallel_state.get_expert_model_parallel_world_size()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    offset = layer_offset(dims)
    stacks: dict[str, torch.Tensor] = {}  # an experts unit, read once for all its local experts
    for local_name, param in model.named_parameters():
        unit = experts.unit_of(local_name)
        if unit is not None:
            name, j = to_global(unit[0], offset), unit[1]
            if name not in stacks:
                stacks = {name: hf_to_megatron(name, hf, dims, tp, tp_rank, ep, ep_rank)}
            param.copy_(stacks[name][j].to(param.dtype))
            continue
        name = to_global(local_name, offset)
        if name == "output_layer.weight" and dims.tied and not dims.value_head:
            # pipeline-parallel with tied embeddings: the last stage keeps its own copy of them
            name = "embedding.word_embeddings.weight"
        param.copy_(hf_to_megatron(name, hf, dims, tp, tp_rank).to(param.dtype))


def freeze_padding_embedding(model: GPTModel, pad_token_id: int | None) -> None:
    """HF embeddings take `padding_idx=pad_token_id`: a lookup of the pad token passes no gradient to
    its row (a response may sample that token). megatron-core's embedding has no such notion, so
    detach the looked-up vectors of pad tokens to train exactly as the HF model does."""
    if pad_token_id is None or not hasattr(model, "embedding"):  # later pipeline stages embed nothing
        return

    def detach_pad_rows(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        is_pad = args[0] == pad_token_id  # [b, s]
        if model.config.sequence_parallel:  # the output is this TP rank's slice of [s, b, h]
            chunk = output.shape[0]
            rank = parallel_state.get_tensor_model_parallel_rank()
            is_pad = is_pad.t()[rank * chunk : (rank + 1) * chunk]
        return torch.where(is_pad.unsqueeze(-1), output.detach(), output)

    model.embedding.word_embeddings.register_forward_hook(detach_pad_rows)
