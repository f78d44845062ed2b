"""trainer.freeze_router: the MoE routers lose their gradient, nothing else does; a dense model is
refused in one line naming the setting."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from rlcore.backends.common.hf_model import freeze_routers

SMALL = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)  # fmt: skip


def test_only_the_routers_are_frozen() -> None:
    config = AutoConfig.for_model(
        "qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, **SMALL
    )
    model = AutoModelForCausalLM.from_config(config)
    assert freeze_routers(model) == 2
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    assert frozen == ["model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight"]


def test_a_dense_model_has_no_router_to_freeze() -> None:
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL))
    with pytest.raises(
        ValueError,
        match=r"^trainer\.freeze_router: the model has no MoE router .*set trainer\.freeze_router=false$",
    ):
        freeze_routers(model)


def test_every_strategy_refuses_a_config_asking_for_the_router_loss(tmp_path) -> None:
    from rlcore.backends.common.hf_model import load_causal_lm

    config = AutoConfig.for_model(
        "qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        output_router_logits=True,
        **SMALL,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"^model config output_router_logits must be false: .* on every strategy"
    ):
        load_causal_lm(str(tmp_path))  # fsdp and fsdp2 (megatron: test_megatron_mapping.py)
