"""Inference engines behind the RolloutEngine interface (engines/base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.registry import Registry

if TYPE_CHECKING:
    from .base import RolloutEngine
    from .tinker import ServiceSpec

ENGINES = Registry(
    "explorer.rollout_model.engine_type",
    {
        "hf": "rlcore.rollout.engines.hf:HFEngine",
        "vllm": "rlcore.rollout.engines.vllm:VLLMEngine",
        "tinker": "rlcore.rollout.engines.tinker:TinkerEngine",
    },
)


def build_engine(
    engine_type: str,
    model_path: str,
    *,
    device: str,
    dtype: str,
    max_model_len: int | None,
    max_batch_size: int,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.9,
    enforce_eager: bool = False,
    enable_sleep_mode: bool = False,
    in_process: bool = False,
    seed: int = 0,
    service: ServiceSpec | None = None,
) -> RolloutEngine:
    """Construct the engine `engine_type` names; the vLLM-only options go to vLLM only (the HF
    engine refuses a tensor-parallel size above 1; enforce_eager goes to both). `max_model_len` None
    takes the model's own position limit; one above it is refused (ValueError). `service`: the Tinker
    service the tinker engine samples from (that engine only)."""
    cls = ENGINES.resolve(engine_type)
    common = {
        "device": device,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_batch_size": max_batch_size,
    }
    if engine_type == "tinker":
        return cls(model_path, **common, service=service)
    if engine_type != "vllm":
        if tensor_parallel_size != 1:
            raise ValueError(
                f"tensor_parallel_size must be 1 for the {engine_type} engine; got {tensor_parallel_size}"
            )
        return cls(model_path, **common, enforce_eager=enforce_eager)
    return cls(
        model_path, **common, tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
        enable_sleep_mode=enable_sleep_mode, in_process=in_process, seed=seed,
    )  # fmt: skip
