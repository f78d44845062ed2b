"""GPU tier: the same GRPO loop on CUDA with NCCL and bf16 compute. Skipped without a CUDA device."""

import os

import pytest
import torch

from tests.integration.launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]


def test_grpo_trains_on_cuda_with_bf16(tmp_path):
    """The rollout worker gets a GPU of its own and NCCL weight sync where there are two; on one GPU
    it shares the trainer's and loads the weights from a checkpoint (NCCL cannot share a device)."""
    root = str(tmp_path)
    sync = "nccl" if torch.cuda.device_count() >= 2 else "checkpoint"
    cfg = tiny_grpo_config(
        root,
        **{
            "cluster.device": "cuda",
            "model.dtype": "bfloat16",
            "buffer.total_steps": 3,
            "synchronizer.sync_method": sync,
        },
    )
    launch(cfg, os.path.join(root, "cfg.yaml"))
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "actor/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(m["actor/grad_norm"])) for m in steps)
