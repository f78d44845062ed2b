"""trainer.fsdp_config.param_offload and trainer.offload_untrained_models: off by default, and refused
in one line naming the key on a strategy that does not offload."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve


def test_offload_is_off_by_default_and_fsdp2_takes_it(tmp_path) -> None:
    t = resolve(tmp_path).trainer
    assert (t.fsdp_config.param_offload, t.offload_untrained_models) == (False, False)
    t = resolve(tmp_path, "trainer.fsdp_config.param_offload=true", "trainer.offload_untrained_models=true").trainer
    assert (t.fsdp_config.param_offload, t.offload_untrained_models) == (True, True)


@pytest.mark.parametrize("key", ["fsdp_config.param_offload", "offload_untrained_models"])
@pytest.mark.parametrize("strategy", ["fsdp", "megatron"])
def test_offload_on_another_strategy_is_refused_in_one_line(tmp_path, key, strategy) -> None:
    message = (
        rf"^trainer\.{key}: offloading to the CPU runs on fsdp2 \(FSDP2's CPUOffloadPolicy\), not {strategy}; "
        r"use --strategy fsdp2, or set it false$"
    )
    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, f"trainer.{key}=true", strategy=strategy)
