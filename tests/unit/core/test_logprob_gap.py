"""LogprobGap: the engine's log-probs against the trainer's, over response tokens only."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlcore.core.step_metrics import LogprobGap


@pytest.fixture()
def world() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_gap_is_the_mean_and_max_over_masked_tokens(world) -> None:
    gap = LogprobGap()
    engine = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, 0.0, 0.0]])
    trainer = torch.tensor([[9.0, -1.5, -2.0, 9.0], [9.0, -0.25, 9.0, 9.0]])  # 9: prompt or padding
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    gap.add(engine, trainer, mask)
    gap.add(torch.zeros(1, 2), torch.full((1, 2), 5.0), torch.zeros(1, 2))  # a dummy micro-batch
    assert gap.metrics(None) == pytest.approx(
        {"rollout/logprob_diff_mean": (0.5 + 0.0 + 0.25) / 3, "rollout/logprob_diff_max": 0.5}
    )


def test_no_response_tokens_reports_nothing(world) -> None:
    gap = LogprobGap()
    gap.add(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2))
    assert gap.metrics(None) == {}
