"""The trainer world's default process group must take the CPU tensors the loop all-reduces."""

from __future__ import annotations

import pytest
from torch.distributed.distributed_c10d import Backend, BackendConfig

from rlcore.runtime.trainer_world import world_backend


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_default_group_takes_cpu_tensors_on_every_device(device: str) -> None:
    """Micro-batch counts and log-prob gap metrics are CPU tensors whatever the device: an NCCL-only
    group (backend "nccl") maps no backend to cpu and fails them at the first all-reduce."""
    backends = BackendConfig(Backend(world_backend(device))).get_device_backend_map()
    assert backends["cpu"] == "gloo", backends
    assert backends["cuda"] == ("nccl" if device == "cuda" else "gloo"), backends
