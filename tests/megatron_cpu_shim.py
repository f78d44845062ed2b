"""Test-only: run megatron-core on a CPU-only torch build.

megatron-core calls CUDA directly in places that have nothing to do with the maths (device
placement of small bookkeeping tensors, streams, events, NVTX ranges, the model-parallel RNG
tracker). `install()` redirects exactly those calls to the CPU inside the current process, so
the CPU parity tests exercise megatron-core's real tensor-, pipeline- and data-parallel code over
gloo. Nothing in the installed package is modified, and rlcore itself never imports this module:
on a CUDA machine megatron-core runs unpatched.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_installed = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)  # a bare index means a GPU


class _CudaToCpu(TorchFunctionMode):
    """Rewrites `device="cuda"` (or an index) to the CPU in factories, `.to()` and `.cuda()`, and
    names CPU tensor types as their CUDA counterparts."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # dtype checks compare against "torch.cuda.FloatTensor" and friends
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinning needs a CUDA driver
        if func is torch.Tensor.to:
            args = tuple("cpu" if i > 0 and _is_cuda(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


class _NullStream:
    """Stands in for torch.cuda.Stream/Event: every operation is already ordered on the CPU."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def query(self) -> bool:
        return True

    def record_event(self, *args: Any, **kwargs: Any) -> _NullStream:
        return _NullStream()  # the MoE token dispatcher synchronises on the event it records

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def install() -> None:
    """Patch this process (idempotent). Call before building any megatron-core object."""
    global _installed
    if _installed:
        return
    assert not torch.cuda.is_available(), (
        "the shim is for CPU-only machines; megatron-core runs as is on CUDA"
    )
    cuda = torch.cuda
    cuda.current_device = lambda: 0  # type: ignore[assignment]  # the mode maps index 0 to the CPU
    cuda.device_count = lambda: 1  # type: ignore[assignment]
    cuda.set_device = lambda *a, **k: None  # type: ignore[assignment]
    cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    cuda.empty_cache = lambda: None  # type: ignore[assignment]
    cuda.Stream = _NullStream  # type: ignore[assignment,misc]
    cuda.Event = _NullStream  # type: ignore[assignment,misc]
    null = _NullStream()
    cuda.current_stream = lambda *a, **k: null  # type: ignore[assignment]
    cuda.default_stream = lambda *a, **k: null  # type: ignore[assignment]
    cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    cuda.nvtx.range_push = lambda *a, **k: None  # type: ignore[assignment]
    cuda.nvtx.range_pop = lambda *a, **k: None  # type: ignore[assignment]
    # torch.manual_seed itself calls cuda.manual_seed_all: seed the CPU generator directly
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(seed)  # type: ignore[assignment]
    cuda.manual_seed_all = lambda seed: None  # type: ignore[assignment]
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[assignment]

    # The model-parallel RNG tracker saves/restores "the GPU's" generator: use the CPU's.
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    _CudaToCpu().__enter__()  # for the life of the process
    # ... but autograd runs backward passes without the caller's torch-function modes: re-enter it
    # around every custom Function's backward (megatron's recompute, vocab-parallel kernels)
    backward_apply = torch.autograd.function.BackwardCFunction.apply

    def apply_with_shim(self: Any, *args: Any) -> Any:
        with _CudaToCpu():
            return backward_apply(self, *args)

    torch.autograd.function.BackwardCFunction.apply = apply_with_shim  # type: ignore[method-assign]
    _installed = True
