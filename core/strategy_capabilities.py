"""What each training strategy can do, in one torch-free table: the config checks read it before any
strategy is imported, and each strategy class carries its own row as `capabilities` (a unit test
holds the two equal)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Capabilities:
    lora: bool
    """Trains a LoRA adapter (model.lora_configs)."""
    offload: bool
    """Offloads models to the CPU (trainer.fsdp_config.param_offload, trainer.offload_untrained_models)."""
    ulysses: bool
    """Splits packed sequences over ranks by Ulysses (trainer.ulysses_sequence_parallel_size)."""
    context_parallel: bool
    """Splits packed sequences over ranks by context parallelism (trainer.megatron.context_parallel_size)."""


CAPABILITIES = {
    "fsdp": Capabilities(lora=True, offload=True, ulysses=True, context_parallel=False),
    "fsdp2": Capabilities(lora=True, offload=True, ulysses=True, context_parallel=False),
    # LoRA on megatron: rlcore's adapters beside its linear layers (backends/megatron/lora.py);
    # it offloads its optimizer instead of models
    "megatron": Capabilities(lora=True, offload=False, ulysses=False, context_parallel=True),
}
"""trainer.strategy -> what it can do."""

MEGATRON_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The HF layers a LoRA adapter can sit on with --strategy megatron: every linear layer of a dense
decoder layer (not the output head, the embedding or a mixture of experts)."""

CAPABILITY_NAMES = tuple(f.name for f in fields(Capabilities))


def strategies_with(capability: str) -> list[str]:
    """The strategies that have `capability` (a Capabilities field), in the table's order."""
    return [name for name, row in CAPABILITIES.items() if getattr(row, capability)]


def has(strategy: str, capability: str) -> bool:
    """Whether `strategy` has `capability` (False for a name the table does not hold)."""
    row = CAPABILITIES.get(strategy)
    return row is not None and bool(getattr(row, capability))
