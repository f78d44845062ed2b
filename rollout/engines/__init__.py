"""Inference engines behind the RolloutEngine interface (engines/base.py)."""

from ...core.registry import Registry

ENGINES = Registry(
    "explorer.rollout_model.engine_type",
    {
        "hf": "rlcore.rollout.engines.hf:HFEngine",
        "vllm": "rlcore.rollout.engines.vllm:VLLMEngine",
    },
)
