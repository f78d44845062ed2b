"""HF <-> megatron-core weight mapping: exact round trips, hand-computed fused layouts, and shapes and
fused-layout semantics checked against real megatron-core modules (built on CPU, no forward of the
whole model)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, MistralConfig, PreTrainedModel, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from rlcore.backends.megatron.mapping import (
    ModelDims,
    check_layout,
    hf_specs,
    hf_specs_of,
    hf_to_megatron,
    megatron_names,
    megatron_to_hf,
    padded_vocab,
    stage_layers,
    stage_of,
    to_global,
    to_local,
    tp_dim,
)
from tests.tiny_models import CASES
from tests.tiny_models import tiny_hf_model as _hf_model

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]  # (tp, pp)


def _hf_export(model: PreTrainedModel, dims: ModelDims) -> dict[str, torch.Tensor]:
    """What an HF export holds: the state dict, without lm_head when it is the embedding itself."""
    state = model.state_dict()
    if dims.tied:
        assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
        del state["lm_head.weight"]
    return state


def _round_trip(
    hf: dict[str, torch.Tensor], dims: ModelDims, tp: int, pp: int
) -> list[tuple[str, torch.Tensor]]:
    """HF tensors -> every (stage, TP rank)'s megatron shards -> HF tensors again, in export order."""
    # every (pp stage, tp rank) builds its shards under LOCAL names, as a megatron stage holds them
    stages: list[dict[str, list[torch.Tensor]]] = []
    for pp_rank in range(pp):
        offset = stage_layers(dims, pp, pp_rank).start
        stages.append(
            {
                to_local(name, offset): [hf_to_megatron(name, hf, dims, tp, r) for r in range(tp)]
                for name in megatron_names(dims)
                if stage_of(name, dims, pp) == pp_rank
            }
        )
    # 4 layers over pp stages: each stage numbers its layers 0 .. 4/pp - 1
    for local in stages:
        layers = {int(n.split(".")[2]) for n in local if n.startswith("decoder.layers.")}
        assert layers == set(range(4 // pp))

    rebuilt: list[tuple[str, torch.Tensor]] = []
    for pp_rank, local in enumerate(stages):
        offset = stage_layers(dims, pp, pp_rank).start
        for name, shards in local.items():
            if tp_dim(name, dims) is None:  # replicated: every TP rank holds the same tensor
                assert all(torch.equal(s, shards[0]) for s in shards)
                shards = shards[:1]
            rebuilt += megatron_to_hf(to_global(name, offset), shards, dims)

    return rebuilt


ROUND_TRIPS = [(case, tp, pp) for case in CASES for tp, pp in LAYOUTS if not (case == "qwen3_moe" and tp > 1)]
"""A MoE model at TP > 1 is refused (test_unsupported_configs_fail_with_one_line)."""


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("case,tp,pp", ROUND_TRIPS)
def test_round_trip_is_exact(case: str, tied: bool, tp: int, pp: int) -> None:
    model = _hf_model(case, tied)
    dims = ModelDims.from_hf_config(model.config)
    hf = _hf_export(model, dims)
    check_layout(dims, tp, pp)

    rebuilt = _round_trip(hf, dims, tp, pp)
    assert [(n, tuple(t.shape)) for n, t in rebuilt] == hf_specs(dims)
    assert sorted(n for n, _ in rebuilt) == sorted(hf)
    for name, tensor in rebuilt:
        assert torch.equal(tensor, hf[name]), name


@pytest.mark.parametrize("tp,pp", [(2, 1), (2, 2)])
@pytest.mark.parametrize("tied", [False, True])
def test_a_critic_maps_its_value_head_replicated(tied: bool, tp: int, pp: int) -> None:
    """A critic's export is the trunk and `score` (no lm_head, tied or not): the head is the last
    stage's `output_layer.weight`/`.bias`, the same whole tensor on every TP rank."""
    model = _hf_model("qwen2_gqa", tied)
    dims = ModelDims.from_hf_config(model.config, value_head=True)
    g = torch.Generator().manual_seed(3)
    hf = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}
    hf["score.weight"], hf["score.bias"] = (
        torch.randn(1, dims.hidden, generator=g),
        torch.randn(1, generator=g),
    )
    assert megatron_names(dims)[-2:] == ["output_layer.weight", "output_layer.bias"]
    assert stage_of("output_layer.bias", dims, pp) == pp - 1 and tp_dim("output_layer.weight", dims) is None
    assert hf_to_megatron("output_layer.weight", hf, dims, tp, tp - 1) is hf["score.weight"]
    rebuilt = _round_trip(hf, dims, tp, pp)
    assert [(n, tuple(t.shape)) for n, t in rebuilt] == hf_specs(dims)
    assert hf_specs(dims)[-2:] == [("score.weight", (1, dims.hidden)), ("score.bias", (1,))]
    assert sorted(n for n, _ in rebuilt) == sorted(hf)
    for name, tensor in rebuilt:
        assert torch.equal(tensor, hf[name]), name


@pytest.mark.parametrize("case", ["qwen2_gqa", "qwen3_gqa", "qwen3_moe"])
@pytest.mark.parametrize("tied", [False, True])
def test_hf_names_are_what_save_pretrained_writes(case: str, tied: bool, tmp_path: Path) -> None:
    """A checkpoint file holds one tensor per expert (what `fused_experts=False` names); in memory
    transformers 5 holds each layer's experts fused, which is what the mapping names by default."""
    model = _hf_model(case, tied)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == {n for n, _ in hf_specs(ModelDims.from_hf_config(model.config, fused_experts=False))}
    in_memory = set(model.state_dict()) - ({"lm_head.weight"} if tied else set())
    assert in_memory == {n for n, _ in hf_specs(ModelDims.from_hf_config(model.config))}
    assert ("lm_head.weight" in saved) is not tied


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_moe_experts_load_from_either_layout_split_over_expert_parallel_ranks(ep: int) -> None:
    """Each EP rank's stacked experts come from the fused in-memory tensors or from the checkpoint's
    per-expert tensors alike, the ranks' stacks in order are all the experts, and they leave in
    either layout as the HF tensors they came from."""
    model = _hf_model("qwen3_moe", False)
    fused = ModelDims.from_hf_config(model.config)
    per_expert = dataclasses.replace(fused, fused_experts=False)
    in_memory = model.state_dict()
    layer = "model.layers.1.mlp.experts."
    gate_up, down = in_memory[layer + "gate_up_proj"], in_memory[layer + "down_proj"]
    moe_ffn = per_expert.moe_ffn
    on_file = {  # what save_pretrained writes for that layer
        **{f"{layer}{e}.gate_proj.weight": gate_up[e, :moe_ffn] for e in range(4)},
        **{f"{layer}{e}.up_proj.weight": gate_up[e, moe_ffn:] for e in range(4)},
        **{f"{layer}{e}.down_proj.weight": down[e] for e in range(4)},
    }
    for unit, full in (("decoder.layers.1.mlp.experts.linear_fc1.weight", gate_up),
                       ("decoder.layers.1.mlp.experts.linear_fc2.weight", down)):  # fmt: skip
        for source in (in_memory, on_file):
            stacks = [hf_to_megatron(unit, source, fused, 1, 0, ep, r) for r in range(ep)]
            assert all(stack.shape[0] == 4 // ep for stack in stacks)
            assert torch.equal(torch.cat(stacks), full)
        assert megatron_to_hf(unit, [full], fused) == [(hf_specs_of(unit, fused)[0][0], full)]
        out = dict(megatron_to_hf(unit, [full], per_expert))
        assert list(out) == [n for n, _ in hf_specs_of(unit, per_expert)]
        assert all(torch.equal(t, on_file[n]) for n, t in out.items())
    with pytest.raises(ValueError, match=r"expert_model_parallel_size \(3\) must divide .*num_experts \(4\)"):
        check_layout(fused, 1, 1, 3)


def _dims(num_heads: int, num_kv_heads: int, ffn: int, head_dim: int = 1) -> ModelDims:
    return ModelDims(
        hidden=1,
        num_layers=1,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        ffn=ffn,
        vocab=5,
        tied=False,
        qkv_bias=True,
        qk_norm=False,
        rms_eps=1e-6,
        rope_theta=1e4,
        max_positions=8,
    )


def test_fused_layouts_by_hand() -> None:
    dims = _dims(num_heads=4, num_kv_heads=2, ffn=4)
    # head_dim 1, hidden 1: q rows are heads q0..q3 (values 0..3), k0,k1 = 10,11, v0,v1 = 20,21
    hf = {
        "model.layers.0.self_attn.q_proj.bias": torch.tensor([0.0, 1, 2, 3]),
        "model.layers.0.self_attn.k_proj.bias": torch.tensor([10.0, 11]),
        "model.layers.0.self_attn.v_proj.bias": torch.tensor([20.0, 21]),
        "model.layers.0.mlp.gate_proj.weight": torch.tensor([[0.0], [1], [2], [3]]),
        "model.layers.0.mlp.up_proj.weight": torch.tensor([[10.0], [11], [12], [13]]),
        "lm_head.weight": torch.tensor([[1.0], [2], [3], [4], [5]]),
    }
    qkv = "decoder.layers.0.self_attention.linear_qkv.bias"
    # grouped per KV head: [q0 q1 k0 v0 | q2 q3 k1 v1]; tp=2 gives each rank one group
    assert hf_to_megatron(qkv, hf, dims, 1, 0).tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert hf_to_megatron(qkv, hf, dims, 2, 1).tolist() == [2, 3, 11, 21]
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    # per TP shard [gate shard; up shard]: rank 0 = g0 g1 u0 u1, rank 1 = g2 g3 u2 u3
    assert hf_to_megatron(fc1, hf, dims, 1, 0).flatten().tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert hf_to_megatron(fc1, hf, dims, 2, 0).flatten().tolist() == [0, 1, 10, 11]
    assert hf_to_megatron(fc1, hf, dims, 2, 1).flatten().tolist() == [2, 3, 12, 13]
    # 5 vocab rows over tp=2 -> padded to 6, rank 1 holds rows 3, 4 and a zero row
    assert padded_vocab(5, 2) == 6 and padded_vocab(6, 2) == 6 and padded_vocab(101, 4) == 104
    out = "output_layer.weight"
    assert hf_to_megatron(out, hf, dims, 2, 1).flatten().tolist() == [4, 5, 0]
    shards = [hf_to_megatron(out, hf, dims, 2, r) for r in range(2)]
    assert megatron_to_hf(out, shards, dims)[0][1].flatten().tolist() == [1, 2, 3, 4, 5]


def test_a_tied_output_layer_is_the_embedding() -> None:
    # pipeline-parallel megatron keeps a copy of a tied embedding on the last stage as output_layer
    dims = dataclasses.replace(_dims(4, 2, 4), tied=True)
    hf = {"model.embed_tokens.weight": torch.arange(5.0).unsqueeze(1)}
    assert "output_layer.weight" not in megatron_names(dims)
    assert hf_to_megatron("output_layer.weight", hf, dims, 2, 0).flatten().tolist() == [0, 1, 2]


def test_stages_and_local_names() -> None:
    dims = dataclasses.replace(_dims(4, 2, 4), num_layers=4)
    assert stage_layers(dims, 2, 1) == range(2, 4)
    assert stage_of("embedding.word_embeddings.weight", dims, 2) == 0
    assert stage_of("decoder.layers.1.mlp.linear_fc2.weight", dims, 2) == 0
    assert stage_of("decoder.layers.2.input_layernorm.weight", dims, 2) == 1
    assert stage_of("decoder.final_layernorm.weight", dims, 2) == 1
    assert stage_of("output_layer.weight", dims, 2) == 1
    name = "decoder.layers.3.mlp.linear_fc2.weight"
    assert to_local(name, 2) == "decoder.layers.1.mlp.linear_fc2.weight"
    assert to_global(to_local(name, 2), 2) == name
    assert to_local("output_layer.weight", 2) == "output_layer.weight"
    assert tp_dim(name, dims) == 1 and tp_dim("decoder.layers.0.self_attention.linear_qkv.bias", dims) == 0
    assert tp_dim("decoder.layers.0.input_layernorm.weight", dims) is None
    assert tp_dim("output_layer.weight", dims) == 0


def test_unsupported_configs_fail_with_one_line() -> None:
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    cases = [
        (Qwen2Config(**base, use_sliding_window=True, sliding_window=8), "use_sliding_window"),
        (LlamaConfig(**base, rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type.*'linear'"),
        (LlamaConfig(**base, attention_bias=True), "attention_bias"),
        (LlamaConfig(**base, hidden_act="gelu"), "hidden_act must be silu"),
        (Qwen3Config(**base, attention_bias=True), "attention_bias must be false for a qwen3"),
        (Qwen3Config(**base, use_sliding_window=True, sliding_window=8), "use_sliding_window"),
        (MistralConfig(**base), "model_type must be one of llama, qwen2, qwen3, qwen3_moe .*'mistral'.*fsdp2"),
        (Qwen3MoeConfig(**base, mlp_only_layers=[0]), "mlp_only_layers must be empty"),
        (Qwen3MoeConfig(**base, output_router_logits=True), "output_router_logits must be false"),
    ]
    for config, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            ModelDims.from_hf_config(config)
        assert "\n" not in str(err.value)

    dims = ModelDims.from_hf_config(LlamaConfig(**base, num_hidden_layers=4, intermediate_size=128))
    with pytest.raises(
        ValueError, match=r"tensor_model_parallel_size \(4\) must divide .*num_key_value_heads \(2\)"
    ):
        check_layout(dims, 4, 1)
    with pytest.raises(
        ValueError, match=r"pipeline_model_parallel_size \(3\) must divide .*num_hidden_layers \(4\)"
    ):
        check_layout(dims, 1, 3)
    check_layout(dims, 2, 4)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size \(2\) must be 1 for a dense model"):
        check_layout(dims, 1, 1, 2)
    moe = ModelDims.from_hf_config(Qwen3MoeConfig(**base, num_hidden_layers=4, num_experts=4))
    check_layout(moe, 2, 1, 2)  # TP2+EP2: sequence parallelism
    check_layout(moe, 2, 1, 1)  # TP2, every expert whole on each TP rank
    critic = ModelDims.from_hf_config(Qwen3MoeConfig(**base, num_hidden_layers=4, num_experts=4), value_head=True)
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size \(2\) with a MoE critic"):
        check_layout(critic, 2, 1, 2)
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size \(2\) with a MoE model runs with sequence parallelism"):
        check_layout(moe, 2, 2, 2)
    with pytest.raises(ValueError, match=r"proven without pipeline and context parallelism"):
        check_layout(moe, 2, 1, 2, cp_size=2)
    check_layout(moe, 1, 2, 4)


# ---- against real megatron-core modules ----


@contextlib.contextmanager
def _megatron_world(tp: int, pp: int, rank: int) -> Iterator[tuple[int, int]]:
    """megatron-core's parallel state for one rank of a tp*pp world inside this process, on torch's
    fake process group (collectives are no-ops, so a row-parallel output stays this rank's partial
    sum). Yields megatron's own (tp_rank, pp_rank) of that rank."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp * pp)
    try:
        parallel_state.initialize_model_parallel(tp, pp, create_gloo_process_groups=False)
        yield (
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_rank(),
        )
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _gpt_model(dims: ModelDims, tp: int, pp: int, pp_rank: int) -> torch.nn.Module:
    """The GPTModel stage the megatron strategy builds (its own config and builder)."""
    from rlcore.backends.megatron.model import build_gpt, transformer_config

    config = transformer_config(dims, tp, pp, torch.float32, on_cpu=True, recompute=False)
    return build_gpt(config, dims, first_stage=pp_rank == 0, last_stage=pp_rank == pp - 1)


# (case, tied, tp, pp). A tied model with pp > 1 is left out: megatron-core moves the last stage's
# copy of the embedding to CUDA while constructing it (the round trip above covers its names).
MEGATRON_LAYOUTS = [
    ("qwen2_gqa", False, 1, 1),
    ("llama_gqa", True, 1, 1),
    ("llama_mha", True, 2, 1),
    ("qwen2_gqa", False, 2, 2),
    ("qwen3_gqa", False, 1, 1),
    ("qwen3_gqa", False, 2, 2),
    ("qwen3_gqa", True, 2, 1),
]


@pytest.mark.parametrize("case,tied,tp,pp", MEGATRON_LAYOUTS)
def test_megatron_core_holds_the_mapped_shapes_and_layouts(case: str, tied: bool, tp: int, pp: int) -> None:
    pytest.importorskip("megatron.core")
    torch.set_num_threads(1)
    hf_model = _hf_model(case, tied)
    dims = ModelDims.from_hf_config(hf_model.config)
    hf = _hf_export(hf_model, dims)
    heads, kv_heads, d = dims.num_heads // tp, dims.num_kv_heads // tp, dims.head_dim
    x = torch.randn(5, 2, dims.hidden, generator=torch.Generator().manual_seed(2))  # [seq, batch, hidden]
    mlp_sums: dict[
        int, torch.Tensor
    ] = {}  # global layer -> sum over TP ranks of megatron's partial MLP output

    for rank in range(tp * pp):
        with _megatron_world(tp, pp, rank) as (tp_rank, pp_rank):
            model = _gpt_model(dims, tp, pp, pp_rank)
            params = dict(model.named_parameters())
            layers = stage_layers(dims, pp, pp_rank)
            expected = [n for n in megatron_names(dims) if stage_of(n, dims, pp) == pp_rank]
            # the stage holds exactly the mapped names, each with the mapped shard's shape
            assert sorted(params) == sorted(to_local(n, layers.start) for n in expected)
            with torch.no_grad():
                for name in expected:
                    params[to_local(name, layers.start)].copy_(hf_to_megatron(name, hf, dims, tp, tp_rank))

            # megatron's own split of the fused QKV gives this rank's HF heads, and its SwiGLU MLP
            # (summed over TP ranks, since the fake all-reduce is a no-op) gives HF's MLP
            with torch.no_grad():
                for local_index, layer in enumerate(model.decoder.layers):
                    hf_layer = hf_model.model.layers[layers.start + local_index]
                    q, k, v = layer.self_attention.get_query_key_value_tensors(x, None)
                    attn = hf_layer.self_attn
                    # Qwen3 normalises each head's query and key (megatron: q/k_layernorm)
                    q_norm, k_norm = (getattr(attn, n, torch.nn.Identity()) for n in ("q_norm", "k_norm"))
                    q_hf = q_norm(attn.q_proj(x).view(5, 2, -1, d))[:, :, tp_rank * heads : (tp_rank + 1) * heads]
                    k_hf = k_norm(attn.k_proj(x).view(5, 2, -1, d))[
                        :, :, tp_rank * kv_heads : (tp_rank + 1) * kv_heads
                    ]
                    v_hf = attn.v_proj(x).view(5, 2, -1, d)[
                        :, :, tp_rank * kv_heads : (tp_rank + 1) * kv_heads
                    ]
                    torch.testing.assert_close(q, q_hf)
                    torch.testing.assert_close(k, k_hf)
                    torch.testing.assert_close(v, v_hf)
                    partial, _ = layer.mlp(x)
                    index = layers.start + local_index
                    mlp_sums[index] = mlp_sums.get(index, torch.zeros_like(partial)) + partial
                    # a replicated norm: megatron's RMSNorm with the mapped weight equals HF's
                    torch.testing.assert_close(
                        layer.pre_mlp_layernorm(x), hf_layer.post_attention_layernorm(x)
                    )

    assert sorted(mlp_sums) == list(range(dims.num_layers))
    with torch.no_grad():
        for index, total in mlp_sums.items():
            # TP partial sums add in another order than HF's one matmul: float32 rounding only
            torch.testing.assert_close(total, hf_model.model.layers[index].mlp(x), rtol=1e-5, atol=1e-5)


def test_pipeline_padding_pads_per_row_fields_by_rows() -> None:
    """Pipelined stages pad every micro-batch to one shape: [B, T] fields to (rows, width), a per-row
    [B] field (each row's sampling temperature) to rows; padding rows carry no loss."""
    from rlcore.backends.megatron.packing import _pad

    mb = {"input_ids": torch.ones(2, 3, dtype=torch.long), "loss_mask": torch.ones(2, 3),
          "temperature": torch.tensor([0.5, 1.0])}  # fmt: skip
    out = _pad(mb, 4, 5)
    assert out["input_ids"].shape == (4, 5) and out["loss_mask"][2:].sum() == 0
    assert out["temperature"].tolist() == [0.5, 1.0, 0.0, 0.0]  # 0: the raw logits of a padding row


def test_a_value_model_gets_the_head_its_folder_lacks() -> None:
    """megatron's value models from any folder: a causal LM's gets a fresh head (a reward model's
    without a bias), a reward model's export (score.weight alone) loads into a critic with bias 0,
    and a head that is there is read as it is."""
    from rlcore.backends.common.hf_model import value_head_init
    from rlcore.backends.megatron.model import with_value_head

    dims = ModelDims.from_hf_config(LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2,
                                                num_hidden_layers=1), value_head=True)  # fmt: skip
    reward = dataclasses.replace(dims, head_bias=False)
    lm = {"model.norm.weight": torch.ones(8)}
    fresh = with_value_head(lm, dims, seed=3)
    assert torch.equal(fresh["score.weight"], value_head_init(8, 3)[0]) and torch.equal(fresh["score.bias"], torch.zeros(1))
    assert "score.bias" not in with_value_head(lm, reward, seed=3)
    export = {**lm, "score.weight": torch.full((1, 8), 0.5)}
    critic = with_value_head(export, dims, seed=3)
    assert torch.equal(critic["score.weight"], export["score.weight"]) and torch.equal(critic["score.bias"], torch.zeros(1))
    assert with_value_head(export, reward, seed=3) is export
