"""megatron-core training strategy: GPTModel with tensor, pipeline and data parallelism.

Importing this package does not import megatron-core; `strategy.py` does.
"""

from __future__ import annotations

import importlib.util

MEGATRON_PIN = "megatron-core>=0.16,<0.17"


def check_available(device: str) -> None:
    """Fail early, in one line, where the strategy cannot run: megatron-core missing, or no CUDA."""
    import torch

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise RuntimeError(
            f"trainer.strategy=megatron needs megatron-core: pip install 'rlcore[megatron]' ({MEGATRON_PIN}), "
            "or use --strategy fsdp2"
        )
    if device == "cpu" or not torch.cuda.is_available():
        raise RuntimeError(
            "trainer.strategy=megatron needs CUDA: megatron-core runs only on NVIDIA GPUs; "
            "on this machine use --strategy fsdp2 (or fsdp), which train the same model on CPU"
        )
