"""megatron-core training strategy: GPTModel with tensor, pipeline and data parallelism.

Importing this package does not import megatron-core; `strategy.py` does.
"""

from __future__ import annotations

import glob
import importlib.util

MEGATRON_PIN = "megatron-core>=0.16,<0.17"


def check_available(device: str, without_torch: bool = False) -> None:
    """Fail early, in one line, where the strategy cannot run: megatron-core missing, or no CUDA.
    `without_torch` (config validate): tell a CUDA machine by its NVIDIA device files instead of
    asking torch, which takes seconds to import."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise RuntimeError(
            f"trainer.strategy=megatron needs megatron-core: pip install 'rlcore[megatron]' ({MEGATRON_PIN}), "
            "or use --strategy fsdp2"
        )
    if device == "cpu" or not (_nvidia_device_files() if without_torch else _torch_sees_cuda()):
        raise RuntimeError(
            "trainer.strategy=megatron needs CUDA: megatron-core runs only on NVIDIA GPUs; "
            "on this machine use --strategy fsdp2 (or fsdp), which train the same model on CPU"
        )


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _nvidia_device_files() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))
