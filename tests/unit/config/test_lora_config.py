"""model.lora_configs: what it resolves to, and what it refuses in one line naming the key."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve


def test_an_adapter_resolves_with_its_defaults_and_a_list_of_targets(tmp_path) -> None:
    (lora,) = resolve(tmp_path, "model.lora_configs=[{lora_rank: 8}]").model.lora_configs
    assert (lora.lora_rank, lora.lora_alpha, lora.target_modules, lora.path) == (8, 32, "all-linear", None)
    (lora,) = resolve(tmp_path, "model.lora_configs=[{target_modules: [q_proj, v_proj]}]").model.lora_configs
    assert list(lora.target_modules) == ["q_proj", "v_proj"]
    assert resolve(tmp_path).model.lora_configs == []  # full fine-tuning by default


@pytest.mark.parametrize(
    ("overrides", "strategy", "message"),
    [
        (["model.lora_configs=[{},{}]"], None, r"model\.lora_configs: one adapter is trained at a time; got 2"),
        (["model.lora_configs=[{target_modules: [q_proj, lm_head]}]"], "megatron",
         r"model\.lora_configs\[0\]: --strategy megatron cannot train target_modules lm_head \(its adapters sit on q_proj"),
        (["model.lora_configs=[{lora_dropout: 0.1}]"], "megatron",
         r"model\.lora_configs\[0\]: --strategy megatron cannot train lora_dropout 0\.1 .*use --strategy fsdp2$"),
        (["algorithm.sync_ref_model=true", "algorithm.kl_loss_coef=0.1"], None,
         r"algorithm\.sync_ref_model: with LoRA the reference policy is the base model"),
        (["model.lora_configs=[{target_modules: everything}]"], None,
         r"model\.lora_configs\[0\]\.target_modules: 'all-linear' or a list of module names"),
        (["model.lora_configs=[{target_modules: []}]"], None, r"model\.lora_configs\[0\]\.target_modules"),
        (["model.lora_configs=[{path: /no/such/adapter}]"], None,
         r"model\.lora_configs\[0\]\.path: '/no/such/adapter' has no adapter_config\.json"),
        (["model.lora_configs=[{lora_dtype: bfloat16}]"], None, r"lora_dtype must be one of auto, float32"),
        (["model.lora_configs=[{lora_rank: 0}]"], None, r"model\.lora_configs\[0\]\.lora_rank"),
    ],
)  # fmt: skip
def test_a_bad_adapter_is_refused_in_one_line(tmp_path, overrides, strategy, message) -> None:
    adapter = (
        [] if any(o.startswith("model.lora_configs") for o in overrides) else ["model.lora_configs=[{}]"]
    )
    with pytest.raises(ConfigError, match=message) as err:
        resolve(tmp_path, *adapter, *overrides, strategy=strategy)
    assert "\n" not in str(err.value)


def test_megatron_refuses_an_adapter_folder_with_per_layer_ranks(tmp_path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "rank_pattern": {"q_proj": 8}}'
    )
    resolve(tmp_path, f"model.lora_configs=[{{path: {adapter}}}]", strategy="fsdp2")  # peft reads rank_pattern
    with pytest.raises(ConfigError, match=r"model\.lora_configs\[0\]\.path: --strategy megatron cannot train rank_pattern"):
        resolve(tmp_path, f"model.lora_configs=[{{path: {adapter}}}]", strategy="megatron")


def test_an_adapter_folder_with_trained_lora_biases_is_refused(tmp_path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_bias": true}')
    with pytest.raises(ConfigError, match=r"model\.lora_configs\[0\]\.path: the adapter at .* uses lora_bias; rlcore"):
        resolve(tmp_path, f"model.lora_configs=[{{path: {adapter}}}]")


def test_an_adapter_folder_with_more_than_plain_lora_is_refused_at_load(tmp_path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "use_dora": true, "bias": "none"}')
    with pytest.raises(ConfigError, match=r"model\.lora_configs\[0\]\.path: the adapter at .* uses DoRA"):
        resolve(tmp_path, f"model.lora_configs=[{{path: {adapter}}}]")
