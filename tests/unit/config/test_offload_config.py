"""trainer.fsdp_config.param_offload and trainer.offload_untrained_models: off by default, and refused
in one line naming the key on a strategy that does not offload."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve


def test_offload_is_off_by_default_and_fsdp2_and_fsdp_take_it(tmp_path) -> None:
    t = resolve(tmp_path).trainer
    assert (t.fsdp_config.param_offload, t.offload_untrained_models) == (False, False)
    t = resolve(tmp_path, "trainer.fsdp_config.param_offload=true", "trainer.offload_untrained_models=true").trainer
    assert (t.fsdp_config.param_offload, t.offload_untrained_models) == (True, True)
    t = resolve(tmp_path, "trainer.fsdp_config.param_offload=true", "cluster.device=cuda", strategy="fsdp").trainer
    assert t.fsdp_config.param_offload


@pytest.mark.parametrize("key", ["fsdp_config.param_offload", "offload_untrained_models"])
def test_offload_on_megatron_is_refused_in_one_line(tmp_path, key) -> None:
    message = (
        rf"^trainer\.{key}: offloading a model to the CPU runs on fsdp and fsdp2, not megatron; "
        r"use --strategy fsdp2, or set it false \(megatron offloads its optimizer: "
        r"trainer\.megatron\.optimizer_offload_fraction\)$"
    )
    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, f"trainer.{key}=true", strategy="megatron")


@pytest.mark.parametrize("key", ["fsdp_config.param_offload", "offload_untrained_models"])
def test_fsdp1_offload_on_a_cpu_is_refused_in_one_line(tmp_path, key) -> None:
    message = rf"^trainer\.{key}: FSDP1's CPU offload needs a GPU \(torch refuses it on a CPU device\); "
    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, f"trainer.{key}=true", "cluster.device=cpu", strategy="fsdp")


@pytest.mark.parametrize("sets", [["cluster.device=cpu", "model.dtype=bfloat16"], ["cluster.device=cuda", "model.dtype=float32"]])
def test_megatron_optimizer_offload_needs_16_bit_parameters_on_a_gpu(tmp_path, sets) -> None:
    cfg = resolve(tmp_path, "trainer.megatron.optimizer_offload_fraction=1.0", "cluster.device=cuda",
                  "model.dtype=bfloat16", strategy="megatron")  # fmt: skip
    assert cfg.trainer.megatron.optimizer_offload_fraction == 1.0
    message = r"^trainer\.megatron\.optimizer_offload_fraction=1\.0: megatron-core offloads the optimizer of 16-bit"
    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, "trainer.megatron.optimizer_offload_fraction=1.0", *sets, strategy="megatron")
