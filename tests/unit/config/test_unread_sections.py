"""A section that the stage's settings never read (trainer.megatron under fsdp/fsdp2, trainer.tinker
without a Tinker service) is refused in one line, as the project refuses other settings that would
change nothing."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve


def test_megatron_settings_under_another_strategy_are_refused(tmp_path) -> None:
    for strategy in ("fsdp", "fsdp2"):
        with pytest.raises(
            ConfigError,
            match=rf"^trainer\.megatron\.tensor_model_parallel_size: trainer\.megatron is read by strategy megatron "
            rf"only, and trainer\.strategy is {strategy} \(it would change nothing\): use --strategy megatron, or "
            r"drop trainer\.megatron$",
        ):
            resolve(tmp_path, "trainer.megatron.tensor_model_parallel_size=2", strategy=strategy)
    with pytest.raises(ConfigError, match=r"^trainer\.megatron\.use_distributed_optimizer: "):
        resolve(tmp_path, "trainer.megatron.use_distributed_optimizer=false")
    # its defaults, spelt out, change nothing either way
    assert resolve(tmp_path, "trainer.megatron.tensor_model_parallel_size=1").trainer.strategy == "fsdp2"


def test_tinker_settings_without_a_tinker_service_are_refused(tmp_path) -> None:
    pattern = (
        r"^trainer\.tinker\.base_model: trainer\.tinker is read only when trainer\.remote names a Tinker service, "
        r"and trainer\.remote is {} \(it would change nothing\): set trainer\.remote=tinker://host:port, or drop "
        r"trainer\.tinker$"
    )
    with pytest.raises(ConfigError, match=pattern.format("not set")):
        resolve(tmp_path, "trainer.tinker.base_model=m")
    with pytest.raises(ConfigError, match=pattern.format("'127\\.0\\.0\\.1:7000'")):
        resolve(tmp_path, "trainer.tinker.base_model=m", "trainer.remote=127.0.0.1:7000")
    with pytest.raises(ConfigError, match=r"^trainer\.tinker\.api_key_env: "):
        resolve(tmp_path, "trainer.tinker.api_key_env=MY_KEY")
