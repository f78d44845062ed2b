"""LoRA's views of a peft model's state (backends/common/lora.py), on a plain peft model in one
process: the merged stream equals peft's merge_and_unload under HF names, its specs announce it in
order, the adapter stream is what peft saves, and a bad adapter is refused in one line."""

from __future__ import annotations

import pytest
import torch

from rlcore.backends.common.hf_model import load_causal_lm
from rlcore.backends.common.lora import LoraLayout, adapter_modules, apply_lora
from rlcore.core.config.schema import LoraConfig


def _peft(tiny_model_path: str, **kw) -> torch.nn.Module:
    model = apply_lora(load_causal_lm(tiny_model_path), LoraConfig(lora_rank=4, lora_alpha=8, **kw), seed=0)
    with torch.no_grad():  # B is 0 in a fresh adapter: merged would equal the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return model


def test_merged_stream_is_peft_merge_under_hf_names_and_specs_announce_it(tiny_model_path) -> None:
    model = _peft(tiny_model_path, target_modules=["q_proj", "down_proj"])
    layout = LoraLayout.of(model, "default")
    state = list(model.state_dict().items())
    merged = list(layout.merged(iter(state)))
    specs = layout.specs([(n, t.dtype, tuple(t.shape)) for n, t in state])
    assert [(n, t.dtype, tuple(t.shape)) for n, t in merged] == specs
    want = load_causal_lm(tiny_model_path).state_dict()
    assert [n for n, _ in merged] == list(want)  # the HF model's names and order
    reference = model.merge_and_unload().state_dict()
    changed = 0
    for name, tensor in merged:
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6)
        changed += not torch.equal(tensor, want[name])
    assert changed == 2 * 4  # q_proj and down_proj of each of the 4 blocks moved, nothing else


def test_adapter_stream_is_what_peft_saves(tiny_model_path) -> None:
    from peft import get_peft_model_state_dict

    model = _peft(tiny_model_path)
    layout = LoraLayout.of(model, "default")
    got = dict(layout.adapter_entries(iter(model.state_dict().items())))
    want = get_peft_model_state_dict(model)
    assert list(got) == list(want)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert layout.config["r"] == 4 and layout.config["target_modules"]  # JSON-ready (no sets)
    # FSDP1's own units: the adapter's linear factors, two per adapted layer (7 per block)
    assert len(adapter_modules(model, "default")) == 2 * 7 * 4


def test_only_the_adapter_trains_and_it_starts_as_the_base(tiny_model_path) -> None:
    model = apply_lora(load_causal_lm(tiny_model_path), LoraConfig(lora_rank=4), seed=0)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)
    x = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=x).logits, load_causal_lm(tiny_model_path)(input_ids=x).logits
        )


def test_target_modules_matching_nothing_is_refused(tiny_model_path) -> None:
    with pytest.raises(ValueError, match="target_modules"):
        apply_lora(load_causal_lm(tiny_model_path), LoraConfig(target_modules=["no_such_layer"]), seed=0)


def test_an_adapter_with_extra_trained_modules_is_refused_by_name(tiny_model_path, tmp_path) -> None:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"])
    get_peft_model(load_causal_lm(tiny_model_path), config).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="modules_to_save"):
        apply_lora(load_causal_lm(tiny_model_path), LoraConfig(path=str(tmp_path)), seed=0)
