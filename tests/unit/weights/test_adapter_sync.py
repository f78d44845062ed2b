"""Adapter-only weight sync (weights/adapter.py): the entries the trainer's LoRA layout sends, merged
by the engine's side, give bit for bit the weights the merged view gives, on a model whose layers
store their weights as Linear does (Llama) and transposed (GPT-2's Conv1D); the plan and the config
check decide when it runs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'rlcore[lora]'")
import yaml  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig  # noqa: E402

from rlcore.backends.common.lora import LoraLayout, apply_lora  # noqa: E402
from rlcore.core.config import ConfigError, load_config, resolve_stages  # noqa: E402
from rlcore.core.config.plan import ADAPTER_ENGINES  # noqa: E402
from rlcore.core.config.schema import LoraConfig  # noqa: E402
from rlcore.weights.adapter import BASE, SCALE, merge_adapters  # noqa: E402

CONFIGS = {
    "llama": LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32),
    "gpt2": GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32),
}  # fmt: skip


def _layout(kind: str) -> tuple[torch.nn.Module, LoraLayout]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind])
    peft_model = apply_lora(model, LoraConfig(lora_rank=4, lora_alpha=12, target_modules="all-linear"), seed=0)
    _train(peft_model)
    return peft_model, LoraLayout.of(peft_model, "default")


def _train(peft_model: torch.nn.Module) -> None:
    """An update of the adapter (B starts at zero: the merged weight would be the base)."""
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.1)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_engine_merges_the_adapter_into_the_weights_the_merged_view_gives(kind: str) -> None:
    model, layout = _layout(kind)
    state = list(model.state_dict().items())
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in state]
    first = list(layout.sync_entries(state, with_base=True))
    assert [(n, t.dtype, tuple(t.shape)) for n, t in first] == layout.sync_specs(specs, with_base=True)
    bases: dict[str, torch.Tensor] = {}
    got = dict(merge_adapters(first, bases))
    want = dict(layout.merged(state))
    assert set(got) == set(want)
    assert all(torch.equal(got[n], want[n]) for n in want), [n for n in want if not torch.equal(got[n], want[n])]
    assert len(bases) == len(layout.scales) and any(n.endswith(SCALE) for n, _ in first)

    # later syncs: the factors and scales alone, merged into the bases the first one left
    _train(model)
    state = list(model.state_dict().items())
    later = list(layout.sync_entries([(n, t) for n, t in state if layout.is_adapter(n)], with_base=False))
    assert not any(n.endswith(BASE) for n, _ in later)
    assert sum(t.numel() for _, t in later) < sum(t.numel() for _, t in state) / 2
    got = dict(merge_adapters(later, bases))
    want = dict(layout.merged(state))
    assert set(got) == {layout.hf_name(layer) + ".weight" for layer in layout.scales}
    assert all(torch.equal(got[n], want[n]) for n in got)


def test_factors_without_a_base_fail_in_one_line_naming_the_layer() -> None:
    model, layout = _layout("llama")
    adapter = [(n, t) for n, t in model.state_dict().items() if layout.is_adapter(n)]
    with pytest.raises(ValueError, match=r"adapter sync: no base weight of model\.layers\.0\.self_attn\.q_proj"):
        list(merge_adapters(layout.sync_entries(adapter, with_base=False), {}))
    with pytest.raises(ValueError, match="never got its lora_B.weight, lora_scale"):
        list(merge_adapters([("model.layers.0.mlp.up_proj.lora_A.weight", torch.zeros(4, 16))], {}))


def test_all_linear_beside_other_names_adapts_the_head_too() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["llama"])
    peft_model = apply_lora(model, LoraConfig(lora_rank=4, target_modules=["all-linear", "lm_head"]), seed=0)
    adapted = {name.split(".")[-1] for name in LoraLayout.of(peft_model, "default").scales}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}


def test_engines_declare_what_the_plan_assumes() -> None:
    from rlcore.rollout.engines.hf import HFEngine
    from rlcore.rollout.engines.tinker import TinkerEngine
    from rlcore.rollout.engines.vllm import VLLMEngine

    declared = {"hf": HFEngine, "vllm": VLLMEngine, "tinker": TinkerEngine}
    assert ADAPTER_ENGINES == {name for name, cls in declared.items() if cls.merges_adapters}


def test_the_plan_sends_the_adapter_alone_where_the_engine_merges_it(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    cfg = {"model": {"model_path": str(tmp_path / "m")}, "checkpoint_root_dir": str(tmp_path),
           "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))

    def plan(*overrides: str) -> str:
        return resolve_stages(load_config(str(tmp_path / "c.yaml"), list(overrides)))[0].plan.lora_sync

    lora = "model.lora_configs=[{lora_rank: 4}]"
    assert plan(lora) == "adapter"
    assert plan(lora, "explorer.rollout_model.engine_type=vllm") == "merged"
    assert plan(lora, "synchronizer.lora_sync=merged") == "merged"
    assert plan(lora, "mode=colocate") == "merged"  # in process (memory): no wire to spare
    assert plan(lora, "mode=colocate", "synchronizer.lora_sync=adapter") == "adapter"
    assert plan() == ""  # no LoRA
    with pytest.raises(ConfigError, match="synchronizer.lora_sync: adapter needs engines that merge an adapter"):
        plan(lora, "explorer.rollout_model.engine_type=vllm", "synchronizer.lora_sync=adapter")
    assert plan("synchronizer.lora_sync=adapter") == ""  # a stage without LoRA sends its weights whole
    (tmp_path / "m" / "config.json").write_text('{"tie_word_embeddings": true}')
    with pytest.raises(ConfigError, match=r"target_modules: lm_head shares its weight with the embedding"):
        plan("model.lora_configs=[{lora_rank: 4, target_modules: [all-linear, lm_head]}]")
