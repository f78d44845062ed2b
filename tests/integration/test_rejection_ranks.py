"""Masked importance sampling's rejections over two data-parallel ranks (gloo, one process each):
each rank decides its own row's, and both divide by the same post-rejection counts, so their losses
sum to the one-rank loss (tests/unit/runtime/test_training_correction.py)."""

from __future__ import annotations

import multiprocessing

import pytest
import torch.distributed as dist

from rlcore.core.config.schema import AlgorithmConfig, RolloutCorrectionConfig
from rlcore.runtime.training import loss_norm, reject_tokens
from tests.unit.runtime.test_training_correction import loss_and_grads, rows_named, scored_local

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _rank(rank: int, path: str, out: str) -> None:
    """One of two data-parallel ranks: it holds one row (a or b) and decides its own rejections."""
    dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
    try:
        names = ["a", "b"]
        seqs = rows_named(names)
        mine = scored_local([names[rank]], [seqs[rank]], False, RolloutCorrectionConfig(kind="mis", high=2.0))
        reject_tokens(mine, seqs, None)
        norm = loss_norm(seqs, 4)
        algo = AlgorithmConfig(algorithm_type="grpo", kl_loss_coef=0.0, loss_agg_mode="token-mean")
        loss, _ = loss_and_grads(mine, norm, algo)
        with open(f"{out}.{rank}", "w") as f:
            f.write(f"{norm.num_tokens} {norm.num_seqs} {loss!r}")
    finally:
        dist.destroy_process_group()


def test_every_data_parallel_rank_divides_by_the_same_post_rejection_count(tmp_path) -> None:
    """Token level at C = 2: a keeps 3 of its tokens (A = 1), b its 2 (A = -2): (-3 + 4) / 5."""
    ctx = multiprocessing.get_context("spawn")
    out = str(tmp_path / "rank")
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = [open(f"{out}.{r}").read().split() for r in range(2)]
    assert [g[:2] for g in got] == [["5.0", "2.0"]] * 2  # on both ranks: a's 3 kept tokens and b's 2
    assert float(got[0][2]) + float(got[1][2]) == pytest.approx(0.2, rel=1e-6)  # the one-rank loss
