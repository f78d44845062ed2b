"""bench trl's TRL configurations: what each one sets in TRL's GRPOConfig and which count as fair."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from rlcore.benchmarks.trl_side import TRL_CONFIGS, fair_configs, trl_settings  # noqa: E402


def test_as_shipped_keeps_trls_defaults_and_the_others_turn_checkpointing_off() -> None:
    weights, settings = trl_settings("as-shipped", "bfloat16")
    assert weights == "float32" and settings == {"bf16": True}  # gradient_checkpointing left to TRL (on)
    assert trl_settings("as-shipped", "float32") == ("float32", {"bf16": False})
    assert trl_settings("matched", "bfloat16") == ("float32", {"bf16": True, "gradient_checkpointing": False})
    assert trl_settings("bf16", "bfloat16") == ("bfloat16", {"bf16": True, "gradient_checkpointing": False})
    weights, settings = trl_settings("bf16-cb", "bfloat16")
    assert weights == "bfloat16" and settings["use_transformers_continuous_batching"] is True
    assert settings["gradient_checkpointing"] is False


def test_trl_accepts_every_configurations_settings() -> None:
    pytest.importorskip("trl")
    from trl import GRPOConfig

    for config in TRL_CONFIGS:
        _, settings = trl_settings(config, "float32")
        args = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, report_to=[], **settings)
        assert args.gradient_checkpointing is (config == "as-shipped")


def test_the_fair_configurations_run_in_rlcores_dtype() -> None:
    assert fair_configs("bfloat16") == ("bf16", "bf16-cb")
    assert fair_configs("float32") == ("matched",)
    assert set(fair_configs("bfloat16")) | set(fair_configs("float32")) < set(TRL_CONFIGS)
