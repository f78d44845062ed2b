"""Sharded checkpoints (backends/common/sharded_checkpoint.py) taken before an optimizer's first
step change nothing that follows: torch's get_state_dict makes an unstepped AdamW's state by a step
on zero gradients, which would count in its bias correction, in the live optimizer and in one
loaded from the save."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlcore.backends.common.sharded_checkpoint import load_sharded, save_sharded


@pytest.fixture()
def world():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _parts() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int = 3) -> torch.Tensor:
    x = torch.arange(8.0).reshape(2, 4) / 8
    for _ in range(n):
        model(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.weight.detach().clone()


def test_a_save_before_the_first_step_changes_nothing_that_follows(world, tmp_path) -> None:
    model, optimizer, _ = _parts()
    want = _steps(model, optimizer)

    model, optimizer, scheduler = _parts()
    save_sharded(str(tmp_path / "ckpt"), model, optimizer, scheduler)
    assert not optimizer.state  # the live optimizer as it was
    assert torch.equal(_steps(model, optimizer), want)

    model, optimizer, scheduler = _parts()
    load_sharded(str(tmp_path / "ckpt"), model, optimizer, scheduler)
    assert not optimizer.state  # loaded as saved: never stepped
    assert torch.equal(_steps(model, optimizer), want)


def test_a_save_after_steps_resumes_exactly(world, tmp_path) -> None:
    model, optimizer, scheduler = _parts()
    _steps(model, optimizer, 2)
    save_sharded(str(tmp_path / "ckpt"), model, optimizer, scheduler)
    want = _steps(model, optimizer, 2)
    model, optimizer, scheduler = _parts()
    load_sharded(str(tmp_path / "ckpt"), model, optimizer, scheduler)
    assert torch.equal(_steps(model, optimizer, 2), want)
