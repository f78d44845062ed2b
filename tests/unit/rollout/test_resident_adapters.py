"""LoRA adapters held beside an engine's weights (rollout/engines/adapters.py), on the HF engine in this
process: the forward with an adapter equals the merged model's, the base is untouched, hooks leave
with the last adapter that needs them, and what cannot be held is refused in one line."""

from __future__ import annotations

import pytest
import torch

from rlcore.rollout.engines.adapters import ResidentAdapters
from rlcore.rollout.engines.hf import HFEngine


def _save(model_path: str, folder: str, targets, r: int = 2, std: float = 0.3) -> torch.nn.Module:
    """A peft adapter with random B saved in `folder`; returns its merged model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
        LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=std)
    model.save_pretrained(folder)
    return model.merge_and_unload()


def test_an_adapter_computes_its_merged_model_and_leaves_the_base(bpe_model_path, tmp_path) -> None:
    engine = HFEngine(bpe_model_path)
    merged = _save(bpe_model_path, str(tmp_path / "a"), ["q_proj", "down_proj"])
    ids = torch.tensor([engine.tokenizer.encode("12+7=")])
    with torch.no_grad():
        base = engine.model(ids).logits
        engine.load_adapter("a", str(tmp_path / "a"))
        assert engine.adapter_names() == {"a": str(tmp_path / "a")}
        with engine.adapters.active("a"):
            adapted = engine.model(ids).logits
        after = engine.model(ids).logits
        want = merged(ids).logits
    torch.testing.assert_close(adapted, want, rtol=0, atol=1e-5)
    assert (adapted - base).abs().max() > 1e-2  # the adapter matters
    assert torch.equal(after, base)  # outside the request the engine's own weights answer
    engine.unload_adapter("a")
    assert not engine.adapters._hooks and engine.adapter_names() == {}


def test_what_cannot_be_held_is_refused_in_one_line(bpe_model_path, tiny_model_path, tmp_path) -> None:
    engine = HFEngine(bpe_model_path)
    _save(tiny_model_path, str(tmp_path / "other"), ["q_proj"])  # another model's shapes
    cases = [
        ("bad name", str(tmp_path / "other"), r"^adapter name 'bad name': letters, digits"),
        ("x", str(tmp_path / "none"), r"^adapter x: '.*none' holds no adapter_config\.json"),
        ("x", str(tmp_path / "other"), r"^adapter x: '.*other' does not fit this model at .*q_proj \(A \(2, 128\)"),
    ]
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text((tmp_path / "other" / "adapter_config.json").read_text())
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x07\x00not a safetensors file")
    cases.append(("x", str(corrupt), r"^adapter x: '.*corrupt' holds an adapter_model\.safetensors that cannot be read"))
    for name, path, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.load_adapter(name, path)
    with pytest.raises(KeyError, match=r"adapter nope is not loaded here \(loaded: none\)"):
        with engine.adapters.active("nope"):
            pass


def test_the_engine_holds_at_most_its_limit(bpe_model_path, tmp_path) -> None:
    engine = HFEngine(bpe_model_path)
    engine.adapters = ResidentAdapters(engine.model, limit=2)
    _save(bpe_model_path, str(tmp_path / "a"), ["v_proj"])
    for name in ("one", "two"):
        engine.load_adapter(name, str(tmp_path / "a"))
    engine.load_adapter("two", str(tmp_path / "a"))  # replacing one held is no new slot
    with pytest.raises(ValueError, match=r"^adapter three: this engine holds 2 adapters already \(one, two\)"):
        engine.load_adapter("three", str(tmp_path / "a"))
    engine.unload_adapter("one")
    assert engine.adapters._hooks  # "two" still needs its layers' hooks
    engine.unload_adapter("two")
    assert not engine.adapters._hooks
