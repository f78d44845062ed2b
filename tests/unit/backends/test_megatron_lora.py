"""megatron's LoRA adapter in HF terms (backends/megatron/lora.py load_adapter): a fresh adapter is the
one the PyTorch-native strategies draw from the same seed, a saved one is read as peft saved it, and
what megatron's adapters cannot cover is refused in one line. (Training with it: test_lora_parity.py.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoConfig

from rlcore.backends.common.hf_model import load_causal_lm
from rlcore.backends.common.lora import PREFIX, apply_lora
from rlcore.backends.megatron.lora import load_adapter
from rlcore.backends.megatron.mapping import ModelDims
from rlcore.core.config.schema import LoraConfig


def _dims(model_path: str) -> ModelDims:
    return ModelDims.from_hf_config(AutoConfig.from_pretrained(model_path))


def _peft_factors(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF layer -> (A, B) of a peft model's adapter."""
    state = model.state_dict()
    layers = sorted({n.removeprefix(PREFIX).split(".lora_A.")[0] for n in state if ".lora_A." in n})
    return {
        layer: (state[f"{PREFIX}{layer}.lora_A.default.weight"], state[f"{PREFIX}{layer}.lora_B.default.weight"])
        for layer in layers
    }


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj", "down_proj"]])
def test_a_fresh_adapter_is_the_one_fsdp_draws_from_the_same_seed(tiny_model_path, targets) -> None:
    cfg = LoraConfig(lora_rank=4, lora_alpha=12, target_modules=targets)
    adapter = load_adapter(cfg, tiny_model_path, _dims(tiny_model_path), seed=7)
    want = _peft_factors(apply_lora(load_causal_lm(tiny_model_path), cfg, seed=7))
    assert sorted(adapter.factors) == sorted(want)
    for layer, (a, b) in adapter.factors.items():
        assert torch.equal(a, want[layer][0]), layer
        assert torch.equal(b, want[layer][1]) and not b.any(), layer  # B = 0: the first policy is the base
    assert adapter.scale == 3.0
    assert adapter.config["r"] == 4 and adapter.config["lora_alpha"] == 12
    other = load_adapter(cfg, tiny_model_path, _dims(tiny_model_path), seed=8)
    layer = next(iter(adapter.factors))
    assert not torch.equal(other.factors[layer][0], adapter.factors[layer][0])  # the seed draws it


def test_a_saved_adapter_is_read_as_peft_saved_it(tiny_model_path, tmp_path) -> None:
    cfg = LoraConfig(lora_rank=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "gate_proj"])
    model = apply_lora(load_causal_lm(tiny_model_path), cfg, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    model.save_pretrained(str(tmp_path))
    adapter = load_adapter(LoraConfig(path=str(tmp_path)), tiny_model_path, _dims(tiny_model_path), seed=0)
    want = _peft_factors(model)
    assert list(adapter.factors) == [  # model order: layer by layer, each layer's projections in order
        f"model.layers.{i}.{p}" for i in range(4) for p in ("self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj")
    ]
    for layer, (a, b) in adapter.factors.items():
        assert torch.equal(a, want[layer][0]) and torch.equal(b, want[layer][1]), layer
    assert adapter.scale == 2.0 and sorted(adapter.config["target_modules"]) == ["gate_proj", "k_proj", "o_proj"]


@pytest.mark.parametrize(
    ("cfg", "moe", "message"),
    [
        (LoraConfig(target_modules=["all-linear", "lm_head"]), False,
         r"^model\.lora_configs\[0\]\.target_modules: megatron's adapters sit on q_proj, .* got lm_head: leave"),
        (LoraConfig(lora_dropout=0.05), False, r"^model\.lora_configs\[0\]\.lora_dropout=0\.05: megatron's adapters"),
        (LoraConfig(), True, r"^model\.lora_configs: megatron's LoRA adapts dense policies, not a mixture-of-experts"),
    ],
)  # fmt: skip
def test_what_megatron_adapters_cannot_cover_is_refused_in_one_line(tiny_model_path, cfg, moe, message) -> None:
    dims = _dims(tiny_model_path)
    if moe:
        dims = dataclasses.replace(dims, num_experts=4)
    with pytest.raises(ValueError, match=message) as err:
        load_adapter(cfg, tiny_model_path, dims, seed=0)
    assert "\n" not in str(err.value)


def test_a_saved_adapter_megatron_cannot_hold_is_refused_in_one_line(tiny_model_path, tmp_path) -> None:
    """An adapter on some layers only (peft's layers_to_transform: megatron's checkpoints hold a
    projection's factors for every layer at once), and one with a trained bias beside its factors."""
    from safetensors.torch import load_file, save_file

    model = apply_lora(load_causal_lm(tiny_model_path), LoraConfig(lora_rank=4, target_modules=["q_proj"]), seed=0)
    model.save_pretrained(str(tmp_path / "full"))
    weights = load_file(str(tmp_path / "full" / "adapter_model.safetensors"))
    dims = _dims(tiny_model_path)
    for case, changed in (
        ("partial", {k: v for k, v in weights.items() if ".layers.2." not in k}),
        ("biased", {**weights, next(iter(weights)).replace("lora_A.weight", "lora_B.bias"): torch.zeros(4)}),
    ):
        folder = tmp_path / case
        folder.mkdir()
        (folder / "adapter_config.json").write_text((tmp_path / "full" / "adapter_config.json").read_text())
        save_file(changed, str(folder / "adapter_model.safetensors"))
        message = {
            "partial": r"leaves out model\.layers\.2\.self_attn\.q_proj; megatron's adapters sit on a projection in every layer",
            "biased": r"holds base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_B\.bias, which is no plain LoRA factor",
        }[case]  # fmt: skip
        with pytest.raises(ValueError, match=r"^model\.lora_configs\[0\]\.path: the adapter at .*" + message) as err:
            load_adapter(LoraConfig(path=str(folder)), tiny_model_path, dims, seed=0)
        assert "\n" not in str(err.value)
