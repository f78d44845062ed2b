"""HF <-> megatron-core weight mapping for Llama-, Qwen2-, Qwen3- and Qwen3-MoE-family models.

The megatron side is a `GPTModel` built with the local layer spec (RMSNorm, SwiGLU, no linear biases,
q/k/v biases for Qwen2, per-head RMSNorms of queries and keys before RoPE for Qwen3, RoPE; for
Qwen3-MoE every MLP a MoELayer: a top-k router and SequentialMLP experts, experts.py). Names here are GLOBAL megatron names (layers numbered across the
whole model); a pipeline stage numbers its own layers from 0, see `to_local` / `to_global`.

Two fused layouts differ from HF and are the reason this module exists (both read from
megatron-core 0.16.1):
- `linear_qkv` rows are grouped by KV head: for each group g, the rows of its nq/nkv query heads,
  then key head g, then value head g (`SelfAttention.get_query_key_value_tensors` views the output as
  [.., ng, (np/ng + 2) * hn] and splits it [np/ng * hn, hn, hn]). A TP shard holds nkv/tp consecutive
  groups, so a shard is a contiguous slice of the fused full tensor.
- `linear_fc1` of each TP shard is [gate shard; up shard] (`MLP` glu: `torch.chunk(x, 2, dim=-1)`,
  the first half goes through the activation), so the full tensor is NOT [gate; up] when tp > 1.

The vocabulary dimension is padded with zero rows to a multiple of the TP size (megatron's
vocab-parallel embedding needs equal shards) and trimmed again on the way back; the logits of the
padded ids must be masked by the caller (see `vocab_shard`).

This module imports only torch, so it can be tested and used without megatron-core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..common.hf_model import check_router_logits
from . import experts

_LAYERS = "decoder.layers."
_EMBEDDING = "embedding.word_embeddings.weight"
_FINAL_NORM = "decoder.final_layernorm.weight"
_OUTPUT = "output_layer.weight"
_OUTPUT_BIAS = "output_layer.bias"
"""Only a critic's output layer (model.py ValueHead) has a bias."""
_QKV_W = "self_attention.linear_qkv.weight"
_QKV_B = "self_attention.linear_qkv.bias"
_PROJ = "self_attention.linear_proj.weight"
_Q_NORM = "self_attention.q_layernorm.weight"
_K_NORM = "self_attention.k_layernorm.weight"
"""Qwen3's q_norm / k_norm: one [head_dim] weight shared by every head, so replicated over TP ranks
(megatron-core sums their gradients over the TP group when `qk_layernorm` is set)."""
_FC1 = "mlp.linear_fc1.weight"
_FC2 = "mlp.linear_fc2.weight"

_ROUTER = ROUTER = "mlp.router.weight"
"""A MoE layer's router (its name inside a decoder layer)."""
_EXPERTS_FC1 = "mlp.experts.linear_fc1.weight"
_EXPERTS_FC2 = "mlp.experts.linear_fc2.weight"
"""A MoE layer's experts as one unit each (not megatron parameters: the local experts'
`linear_fc1`/`linear_fc2` stacked along a first dim of experts; experts.py)."""

# per-layer megatron suffix -> HF suffixes under `model.layers.{i}.`, in the order they are yielded
_LAYER_TO_HF: dict[str, tuple[str, ...]] = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    _QKV_W: ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    _QKV_B: ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    _Q_NORM: ("self_attn.q_norm.weight",),
    _K_NORM: ("self_attn.k_norm.weight",),
    _PROJ: ("self_attn.o_proj.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    _FC1: ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    _FC2: ("mlp.down_proj.weight",),
    _ROUTER: ("mlp.gate.weight",),
    _EXPERTS_FC1: (),  # named by experts.hf_names: the layout depends on transformers' version
    _EXPERTS_FC2: (),
}
_DENSE_ONLY = (_FC1, _FC2)
_MOE_ONLY = (_ROUTER, _EXPERTS_FC1, _EXPERTS_FC2)
_GLOBAL_TO_HF: dict[str, str] = {
    _EMBEDDING: "model.embed_tokens.weight",
    _FINAL_NORM: "model.norm.weight",
    _OUTPUT: "lm_head.weight",
}
# a critic's output layer is a scalar head, replicated over TP ranks: HF's token-classification `score`
_VALUE_HEAD_TO_HF: dict[str, str] = {_OUTPUT: "score.weight", _OUTPUT_BIAS: "score.bias"}
# column-parallel params are split along dim 0, row-parallel along dim 1; the rest are replicated
_TP_DIM: dict[str, int] = {_EMBEDDING: 0, _OUTPUT: 0, _QKV_W: 0, _QKV_B: 0, _FC1: 0, _PROJ: 1, _FC2: 1}


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a Llama/Qwen2/Qwen3 model that decide megatron's parameter layout."""

    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    """The HF (unpadded) vocabulary size."""
    tied: bool
    """HF `tie_word_embeddings`: megatron then has no `output_layer` and HF export writes no lm_head."""
    qkv_bias: bool
    qk_norm: bool
    """Qwen3: an RMSNorm over each head's query and key (q_norm, k_norm) before RoPE."""
    rms_eps: float
    rope_theta: float
    max_positions: int
    value_head: bool = False
    """A critic: a scalar head (HF `score.weight` [1, H], `score.bias` [1]) replaces the output layer."""
    head_bias: bool = True
    """The scalar head has a bias (a critic's; a reward model's has only `score.weight`)."""
    num_experts: int = 0
    """Qwen3-MoE: experts per layer (every layer a MoE layer); 0: a dense model."""
    experts_per_token: int = 0
    moe_ffn: int = 0
    """Each expert's intermediate size."""
    norm_topk_prob: bool = True
    """The chosen experts' weights renormalised to sum to 1 (else the softmax over all experts)."""
    fused_experts: bool = True
    """HF names of the experts as the installed transformers holds them in memory: one
    `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I] per layer (transformers 5),
    or `experts.{e}.gate_proj.weight`... per expert (4.x, and every checkpoint file)."""

    @classmethod
    def from_hf_config(
        cls, config: Any, value_head: bool = False, fused_experts: bool | None = None, head_bias: bool = True
    ) -> ModelDims:
        """Read an HF `LlamaConfig` / `Qwen2Config` / `Qwen3Config` (duck-typed), refusing what
        megatron would not reproduce exactly, so a wrong model fails here rather than training
        silently different. `fused_experts`: the HF layout of a MoE model's experts (None: the
        installed transformers')."""
        model_type = getattr(config, "model_type", None)
        if model_type not in MODEL_TYPES:
            raise ValueError(
                f"model config model_type must be one of {', '.join(MODEL_TYPES)} for megatron; got "
                f"{model_type!r} ({MODEL_TYPES_WHY})"
            )
        if config.hidden_act != "silu":
            raise ValueError(f"model config hidden_act must be silu for megatron; got {config.hidden_act!r}")
        if model_type == "llama" and (config.attention_bias or config.mlp_bias):
            raise ValueError("model config attention_bias and mlp_bias must be false for a llama on megatron")
        if model_type in ("qwen3", "qwen3_moe") and config.attention_bias:
            raise ValueError(f"model config attention_bias must be false for a {model_type} on megatron")
        moe = _moe_dims(config, model_type, fused_experts)
        if model_type != "llama" and getattr(config, "use_sliding_window", False):
            raise ValueError(
                "model config use_sliding_window must be false for megatron (full attention only)"
            )
        rope_type, rope_theta = _rope(config)
        if rope_type != "default":
            raise ValueError(
                f"model config rope_scaling / rope_parameters.rope_type must be unset or 'default' for "
                f"megatron; got {rope_type!r}"
            )
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"model config num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        return cls(
            hidden=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            ffn=config.intermediate_size,
            vocab=config.vocab_size,
            tied=bool(config.tie_word_embeddings),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            rms_eps=float(config.rms_norm_eps),
            rope_theta=float(rope_theta),
            max_positions=config.max_position_embeddings,
            value_head=value_head,
            head_bias=head_bias,
            **moe,
        )


MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")
MODEL_TYPES_WHY = (
    "the HF <-> megatron mapping is written and proven per family, backends/megatron/mapping.py; "
    "other models train on --strategy fsdp or fsdp2"
)


def _moe_dims(config: Any, model_type: str, fused_experts: bool | None) -> dict[str, Any]:
    """ModelDims' MoE fields of a qwen3_moe config (none for a dense model), refusing the layouts
    the mapping does not cover."""
    if model_type != "qwen3_moe":
        return {}
    if getattr(config, "mlp_only_layers", None) or getattr(config, "decoder_sparse_step", 1) != 1:
        raise ValueError(
            "model config mlp_only_layers must be empty and decoder_sparse_step 1 for megatron (every layer "
            "a MoE layer)"
        )
    check_router_logits(config)
    if fused_experts is None:
        from .experts import fused_in_memory

        fused_experts = fused_in_memory(config)
    return {
        "num_experts": config.num_experts,
        "experts_per_token": config.num_experts_per_tok,
        "moe_ffn": config.moe_intermediate_size,
        "norm_topk_prob": bool(config.norm_topk_prob),
        "fused_experts": fused_experts,
    }


def _rope(config: Any) -> tuple[str, float]:
    """(rope type, theta) from transformers >= 5 (`rope_parameters`) or 4.x (`rope_scaling`,
    `rope_theta`)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    return rope_type, params.get("rope_theta", getattr(config, "rope_theta", 10000.0))


def padded_vocab(vocab: int, tp_size: int) -> int:
    """Smallest multiple of `tp_size` that holds `vocab` rows (equal vocab-parallel shards)."""
    return -(-vocab // tp_size) * tp_size


def check_layout(dims: ModelDims, tp_size: int, pp_size: int, ep_size: int = 1, cp_size: int = 1) -> None:
    """Refuse a TP/PP/EP/CP layout that does not split this model into equal shards and stages, or
    that is not proven: a MoE model with tensor parallelism runs with sequence parallelism
    (megatron-core trains MoE layers beside TP only so), proven without pipeline or context parallelism."""
    tp_field = "trainer.megatron.tensor_model_parallel_size"
    ep_field = "trainer.megatron.expert_model_parallel_size"
    if dims.num_experts and tp_size > 1 and dims.value_head:
        raise ValueError(
            f"{tp_field} ({tp_size}) with a MoE critic: sequence parallelism hands its value head a slice of the "
            f"tokens, which it does not gather; set {tp_field} to 1 for the critic's model"
        )
    if dims.num_experts and tp_size > 1 and (pp_size > 1 or cp_size > 1):
        raise ValueError(
            f"{tp_field} ({tp_size}) with a MoE model runs with sequence parallelism, proven without pipeline "
            f"and context parallelism: set trainer.megatron.pipeline_model_parallel_size and context_parallel_size "
            f"to 1, or {tp_field} to 1 (split the experts with {ep_field})"
        )
    if not dims.num_experts and ep_size > 1:
        raise ValueError(
            f"{ep_field} ({ep_size}) must be 1 for a dense model (it splits a MoE model's experts)"
        )
    if dims.num_experts % ep_size:
        raise ValueError(f"{ep_field} ({ep_size}) must divide the model's num_experts ({dims.num_experts})")
    for what, count in (
        ("num_key_value_heads", dims.num_kv_heads),
        ("num_attention_heads", dims.num_heads),
        ("intermediate_size", dims.ffn),
    ):
        if count % tp_size != 0:
            raise ValueError(f"{tp_field} ({tp_size}) must divide the model's {what} ({count})")
    if dims.num_layers % pp_size != 0:
        raise ValueError(
            f"trainer.megatron.pipeline_model_parallel_size ({pp_size}) must divide the model's "
            f"num_hidden_layers ({dims.num_layers})"
        )


def stage_layers(dims: ModelDims, pp_size: int, pp_rank: int) -> range:
    """Global indices of the layers pipeline stage `pp_rank` holds (an even split)."""
    per_stage = dims.num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def megatron_names(dims: ModelDims) -> list[str]:
    """Every global megatron parameter name in the canonical order (the order of HF export)."""
    names = [_EMBEDDING]
    for i in range(dims.num_layers):
        for suffix in _LAYER_TO_HF:
            if (
                (suffix != _QKV_B or dims.qkv_bias)
                and (suffix not in (_Q_NORM, _K_NORM) or dims.qk_norm)
                and suffix not in (_DENSE_ONLY if dims.num_experts else _MOE_ONLY)
            ):
                names.append(f"{_LAYERS}{i}.{suffix}")
    names.append(_FINAL_NORM)
    if dims.value_head:
        names += [_OUTPUT, _OUTPUT_BIAS] if dims.head_bias else [_OUTPUT]
    elif not dims.tied:
        names.append(_OUTPUT)
    return names


def _parse(name: str) -> tuple[int | None, str]:
    """(layer index, suffix after `decoder.layers.{i}.`) or (None, name) for non-layer params."""
    if not name.startswith(_LAYERS):
        return None, name
    index, suffix = name[len(_LAYERS) :].split(".", 1)
    return int(index), suffix


def stage_of(name: str, dims: ModelDims, pp_size: int) -> int:
    """The pipeline stage that owns global megatron parameter `name`."""
    layer, suffix = _parse(name)
    if layer is not None:
        return layer // (dims.num_layers // pp_size)
    assert suffix in _GLOBAL_TO_HF or suffix in _VALUE_HEAD_TO_HF, name
    return 0 if suffix == _EMBEDDING else pp_size - 1


def to_local(name: str, layer_offset: int) -> str:
    """Global name -> the name inside a stage whose first layer is global layer `layer_offset`."""
    layer, suffix = _parse(name)
    return name if layer is None else f"{_LAYERS}{layer - layer_offset}.{suffix}"


def to_global(name: str, layer_offset: int) -> str:
    """Inverse of `to_local`."""
    layer, suffix = _parse(name)
    return name if layer is None else f"{_LAYERS}{layer + layer_offset}.{suffix}"


def tp_dim(name: str, dims: ModelDims) -> int | None:
    """The dim along which tensor parallelism shards `name` (global or local); None = replicated."""
    return _tp_dim(_parse(name)[1], dims)


def _tp_dim(suffix: str, dims: ModelDims) -> int | None:
    return None if dims.value_head and suffix in _VALUE_HEAD_TO_HF else _TP_DIM.get(suffix)


def _hf_names(name: str, dims: ModelDims) -> list[str]:
    layer, suffix = _parse(name)
    if layer is None:
        if dims.value_head and suffix in _VALUE_HEAD_TO_HF:
            return [_VALUE_HEAD_TO_HF[suffix]]
        assert not (dims.tied and suffix == _OUTPUT), "a tied model has no separate output layer in HF"
        return [_GLOBAL_TO_HF[suffix]]
    if suffix in (_EXPERTS_FC1, _EXPERTS_FC2):
        return experts.hf_names(layer, suffix == _EXPERTS_FC1, dims)
    return [f"model.layers.{layer}.{hf}" for hf in _LAYER_TO_HF[suffix]]


# ---- the fused layouts (full tensors, no TP) ----


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: ModelDims) -> torch.Tensor:
    """HF q/k/v projections (weights [heads*d, H] or biases [heads*d]) -> megatron's fused rows,
    grouped per KV head: [q heads of group 0, k0, v0, q heads of group 1, k1, v1, ...]."""
    groups = dims.num_kv_heads
    rest = q.shape[1:]
    fused = torch.cat(
        [q.reshape(groups, -1, *rest), k.reshape(groups, -1, *rest), v.reshape(groups, -1, *rest)], 1
    )
    return fused.reshape(-1, *rest)


def split_qkv(fused: torch.Tensor, dims: ModelDims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`."""
    groups, d = dims.num_kv_heads, dims.head_dim
    rest = fused.shape[1:]
    q, k, v = fused.reshape(groups, -1, *rest).split([dims.num_heads // groups * d, d, d], 1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """TP rank `tp_rank`'s `linear_fc1` shard: [its gate rows; its up rows]."""
    return torch.cat([gate.chunk(tp_size)[tp_rank], up.chunk(tp_size)[tp_rank]])


def split_gate_up(shards: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Full HF (gate, up) from `linear_fc1` shards in TP-rank order."""
    halves = [shard.chunk(2) for shard in shards]
    return torch.cat([gate for gate, _ in halves]), torch.cat([up for _, up in halves])


def vocab_shard(weight: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    """TP rank `tp_rank`'s rows of the vocabulary, padded with zero rows to `padded_vocab`.

    A zero row still gives logit 0, which would enter the softmax: whoever computes logprobs must
    mask the ids >= `ModelDims.vocab` (to -inf) to match HF, which also keeps the rows' gradient 0."""
    rows = padded_vocab(weight.shape[0], tp_size) // tp_size
    shard = weight[tp_rank * rows : (tp_rank + 1) * rows]
    missing = rows - shard.shape[0]
    return torch.cat([shard, shard.new_zeros(missing, *shard.shape[1:])]) if missing else shard


# ---- per-parameter conversion ----


def hf_to_megatron(
    name: str,
    hf: Mapping[str, torch.Tensor],
    dims: ModelDims,
    tp_size: int,
    tp_rank: int,
    ep_size: int = 1,
    ep_rank: int = 0,
) -> torch.Tensor:
    """TP rank `tp_rank`'s shard of global megatron parameter `name`, built from HF tensors (which
    may be a lazy mapping, e.g. a safetensors reader: only the needed names are read). A MoE layer's
    experts unit: EP rank `ep_rank`'s experts, stacked.

    `output_layer.weight` of a tied model is accepted too and gives the embedding shard: with
    pipeline parallelism megatron keeps a copy of the tied embedding on the last stage under that
    name. The result may be a view of an HF tensor; copy it into the parameter."""
    suffix = _parse(name)[1]
    if suffix == _EMBEDDING or (suffix == _OUTPUT and not dims.value_head):
        source = _GLOBAL_TO_HF[_EMBEDDING if dims.tied else suffix]
        return vocab_shard(hf[source], tp_size, tp_rank)
    if suffix in (_EXPERTS_FC1, _EXPERTS_FC2):
        layer = _parse(name)[0]
        assert layer is not None
        return experts.local_stack(hf, layer, suffix == _EXPERTS_FC1, dims, ep_size, ep_rank)
    sources = [hf[hf_name] for hf_name in _hf_names(name, dims)]
    if suffix in (_QKV_W, _QKV_B):
        q, k, v = sources
        return fuse_qkv(q, k, v, dims).chunk(tp_size)[tp_rank]
    if suffix == _FC1:
        gate, up = sources
        return fuse_gate_up(gate, up, tp_size, tp_rank)
    (tensor,) = sources
    dim = _tp_dim(suffix, dims)
    return tensor if dim is None else tensor.chunk(tp_size, dim)[tp_rank]


def megatron_to_hf(
    name: str, shards: Sequence[torch.Tensor], dims: ModelDims
) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors of global megatron parameter `name` from its TP shards in TP-rank order (a
    single shard for a replicated parameter), vocabulary padding trimmed. The tensors may share
    memory with the shards (a replicated parameter comes back as is): copy before changing them."""
    suffix = _parse(name)[1]
    hf_names = _hf_names(name, dims)
    if suffix in (_EXPERTS_FC1, _EXPERTS_FC2):
        (stacked,) = shards  # every expert, gathered over the EP ranks by the caller
        return list(zip(hf_names, experts.to_hf(stacked, suffix == _EXPERTS_FC1, dims), strict=True))
    dim = _tp_dim(suffix, dims)
    if dim is None:
        assert len(shards) == 1, f"{name} is replicated: pass one shard, got {len(shards)}"
        return [(hf_names[0], shards[0])]
    if suffix == _FC1:
        return list(zip(hf_names, split_gate_up(shards), strict=True))
    full = torch.cat(list(shards), dim)
    if suffix in (_EMBEDDING, _OUTPUT):
        return [(hf_names[0], full[: dims.vocab])]
    if suffix in (_QKV_W, _QKV_B):
        return list(zip(hf_names, split_qkv(full, dims), strict=True))
    return [(hf_names[0], full)]


def _hf_shapes(name: str, dims: ModelDims) -> list[tuple[int, ...]]:
    h, q, kv = dims.hidden, dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    shapes: dict[str, list[tuple[int, ...]]] = {
        _EMBEDDING: [(dims.vocab, h)],
        _OUTPUT: [(dims.vocab, h)],
        _FINAL_NORM: [(h,)],
        "input_layernorm.weight": [(h,)],
        "pre_mlp_layernorm.weight": [(h,)],
        _QKV_W: [(q, h), (kv, h), (kv, h)],
        _QKV_B: [(q,), (kv,), (kv,)],
        _Q_NORM: [(dims.head_dim,)],
        _K_NORM: [(dims.head_dim,)],
        _PROJ: [(h, q)],
        _FC1: [(dims.ffn, h), (dims.ffn, h)],
        _FC2: [(h, dims.ffn)],
    }
    suffix = _parse(name)[1]
    if dims.value_head and suffix in _VALUE_HEAD_TO_HF:
        return [(1, h)] if suffix == _OUTPUT else [(1,)]
    if suffix == _ROUTER:
        return [(dims.num_experts, h)]
    if suffix in (_EXPERTS_FC1, _EXPERTS_FC2):
        return experts.hf_shapes(suffix == _EXPERTS_FC1, dims)
    return shapes[suffix]


def hf_specs_of(name: str, dims: ModelDims) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of the tensors global megatron parameter `name` becomes, in the order
    `megatron_to_hf` returns them (known without the data: pipeline stages that do not hold the
    parameter use it to receive them)."""
    return list(zip(_hf_names(name, dims), _hf_shapes(name, dims), strict=True))


def hf_specs(dims: ModelDims) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every exported tensor, in the order `megatron_to_hf` yields them when
    walking `megatron_names(dims)`: what a receiver of `iter_full_weights` can expect up front."""
    return [spec for name in megatron_names(dims) for spec in hf_specs_of(name, dims)]
