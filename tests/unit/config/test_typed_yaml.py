"""A stage config handed to the trainer ranks as YAML (core/config/typed_yaml.py): the text is what
OmegaConf writes for it, it reads back as the same config, and a text that is not exactly typed
takes OmegaConf's path (converted, or refused naming the key), as before."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from rlcore.core.config import ConfigError, load_config, resolve_stages, typed_yaml
from rlcore.core.config.loader import _to_object, from_yaml, to_yaml
from rlcore.core.config.schema import RLCoreConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RECIPES = ["quickstart.yaml", "algorithms/ppo.yaml", "tool_call.yaml", "verifiers.yaml", "lora.yaml"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_stage_config_reads_back_as_omegaconf_reads_it(recipe: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    for stage in resolve_stages(load_config(os.path.join(REPO, "configs", recipe), []), False):
        text = to_yaml(stage.config)
        assert text == OmegaConf.to_yaml(OmegaConf.structured(stage.config))
        typed = typed_yaml.load(RLCoreConfig, text)
        by_omegaconf = _to_object(OmegaConf.merge(OmegaConf.structured(RLCoreConfig), OmegaConf.create(text)))
        assert typed == by_omegaconf == stage.config
        assert repr(typed) == repr(by_omegaconf)  # the same types too (1.0, not 1)


def test_a_text_not_exactly_typed_takes_omegaconfs_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    (stage, *_) = resolve_stages(load_config(os.path.join(REPO, "configs", "quickstart.yaml"), []), False)
    text = to_yaml(stage.config)
    assert "\nseed: 42\n" in text and "  grad_clip: 1.0\n" in text
    assert typed_yaml.load(RLCoreConfig, text.replace("\nseed: 42\n", "\nseed: '42'\n")) is None
    assert from_yaml(text.replace("\nseed: 42\n", "\nseed: '42'\n")).seed == 42  # converted, as before
    assert typed_yaml.load(RLCoreConfig, text.replace("\nseed: 42\n", "\nseed: true\n")) is None
    assert (
        typed_yaml.load(
            RLCoreConfig, text.replace("  grad_clip: 1.0\n", "  grad_clip: 1\n")
        ).trainer.grad_clip
        == 1.0
    )
    assert typed_yaml.load(RLCoreConfig, text + "bogus: 1\n") is None
    with pytest.raises(ConfigError, match="bogus"):
        from_yaml(text + "bogus: 1\n")
    assert typed_yaml.load(RLCoreConfig, "seed: 7\n") is None  # a partial text: OmegaConf fills or refuses
    with pytest.raises(ConfigError, match="model.model_path"):
        from_yaml("seed: 7\n")
    assert typed_yaml.load(RLCoreConfig, "- 1\n") is None


def test_typed_fields_takes_only_what_omegaconf_would_take_unchanged() -> None:
    """The config loader skips OmegaConf's check of a list element (`_item_problems`) where
    typed_fields says every value it sets is already of its field's type; anything else is left to
    OmegaConf, which converts or refuses it."""
    from rlcore.core.config.schema import TasksetConfig

    assert typed_yaml.typed_fields(TasksetConfig, {"name": "t", "rollout_args": {"temperature": 0.0}})
    assert typed_yaml.typed_fields(TasksetConfig, {"rollout_args": {"max_tokens": 8}, "generator_args": {"a": [1]}})
    for untyped in (
        {"rollout_args": {"max_tokens": "8"}},  # a string OmegaConf would convert
        {"rollout_args": {"max_tokens": True}},  # a bool in an int field: OmegaConf refuses it
        {"rollout_args": {"nope": 1}},  # not a field
        {"nope": 1},
        {"reward_fn": "exact_match"},  # a str for a list
        {"name": "${oc.env:X}", "rollout_args": {"max_tokens": "${oc.env:Y}"}},  # resolved later
    ):
        assert not typed_yaml.typed_fields(TasksetConfig, untyped), untyped
    assert not typed_yaml.typed_fields(TasksetConfig, ["not", "a", "mapping"])
