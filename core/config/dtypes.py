"""Which compute dtype a config asks for, by one rule: `auto` is bfloat16 on CUDA and float32
elsewhere; the trainer computes in model.dtype, the engines in explorer.rollout_model.dtype, else in
model.dtype."""

from __future__ import annotations

from typing import Any


def compute_dtype(dtype: str, device: str) -> str:
    """`dtype` (float32, bfloat16, float16 or auto) with auto resolved for `device` (cpu or cuda)."""
    return dtype if dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")


def trainer_dtype(cfg: Any, device: str) -> str:
    return compute_dtype(cfg.model.dtype, device)


def engine_dtype(cfg: Any, device: str) -> str:
    """explorer.rollout_model.dtype, else model.dtype, resolved for `device`."""
    dtype = cfg.explorer.rollout_model.dtype
    return compute_dtype(dtype if dtype != "auto" else cfg.model.dtype, device)
