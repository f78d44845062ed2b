"""What a Tinker model trains, in MB (runtime/tinker/models.state_mb, what `--max-model-mb` limits):
the trainable parameters of the peft model rlcore builds for it, or of the whole model, x 12 bytes."""

from __future__ import annotations

import pytest

from rlcore.backends.common.hf_model import load_causal_lm
from rlcore.backends.common.lora import apply_lora
from rlcore.core.config.schema import LoraConfig
from rlcore.runtime.tinker.models import BYTES_PER_TRAINED, state_mb, targets
from rlcore.runtime.tinker.records import ModelSpec


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec("m", 4),
        ModelSpec("m", 8, train_mlp=False),
        ModelSpec("m", 2, train_attn=False, train_unembed=True),
        ModelSpec("m", 0),
    ],
)
def test_state_mb_counts_what_the_model_trains(tiny_model_path, spec) -> None:
    model = load_causal_lm(tiny_model_path)
    if spec.lora_rank:
        model = apply_lora(model, LoraConfig(lora_rank=spec.lora_rank, target_modules=targets(spec)), seed=0)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert state_mb(spec, tiny_model_path) == pytest.approx(trained * BYTES_PER_TRAINED / 2**20)
