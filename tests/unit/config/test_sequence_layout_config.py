"""trainer.use_remove_padding, balance_batch, ulysses_sequence_parallel_size and
megatron.context_parallel_size: their defaults, and what a Ulysses or context-parallel layout refuses
in one line naming the key."""

from __future__ import annotations

import pytest

from rlcore.core.config import ConfigError

from .minimal import resolve


def test_packing_and_balancing_are_on_by_default_and_ulysses_off(tmp_path) -> None:
    t = resolve(tmp_path).trainer
    assert (t.use_remove_padding, t.balance_batch, t.ulysses_sequence_parallel_size) == (True, True, 1)
    assert resolve(tmp_path, "trainer.ulysses_sequence_parallel_size=2").trainer.ulysses_sequence_parallel_size == 2


@pytest.mark.parametrize(
    ("overrides", "strategy", "message"),
    [
        ([], "megatron", r"^trainer\.ulysses_sequence_parallel_size: Ulysses runs on fsdp and fsdp2, not megatron"),
        (["trainer.use_remove_padding=false"], None,
         r"^trainer\.ulysses_sequence_parallel_size: 2 slices packed sequences; set trainer\.use_remove_padding=true"),
        (["model.scratch.enabled=true", "model.scratch.num_attention_heads=3", "model.scratch.num_key_value_heads=1",
          "model.scratch.hidden_size=96"], None,
         r"^trainer\.ulysses_sequence_parallel_size: 2 must divide model\.scratch\.num_attention_heads \(3\)"),
        (["trainer.ulysses_sequence_parallel_size=0"], None, r"trainer\.ulysses_sequence_parallel_size"),
    ],
)  # fmt: skip
def test_a_ulysses_layout_that_cannot_run_is_refused_in_one_line(tmp_path, overrides, strategy, message) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        resolve(tmp_path, "trainer.ulysses_sequence_parallel_size=2", *overrides, strategy=strategy)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "strategy", "message"),
    [
        ([], "fsdp2", r"^trainer\.megatron\.context_parallel_size: context parallelism runs on megatron, not fsdp2; "
                      r"use --strategy megatron, or trainer\.ulysses_sequence_parallel_size on fsdp/fsdp2"),
        (["trainer.use_remove_padding=false"], "megatron",
         r"^trainer\.megatron\.context_parallel_size: 2 splits packed sequences; set trainer\.use_remove_padding=true"),
        (["trainer.megatron.context_parallel_size=0"], "megatron", r"trainer\.megatron\.context_parallel_size"),
    ],
)  # fmt: skip
def test_a_context_parallel_layout_that_cannot_run_is_refused_in_one_line(tmp_path, overrides, strategy, message) -> None:
    assert resolve(tmp_path).trainer.megatron.context_parallel_size == 1
    with pytest.raises(ConfigError, match=message) as err:
        resolve(tmp_path, "trainer.megatron.context_parallel_size=2", *overrides, strategy=strategy)
    assert "\n" not in str(err.value)
