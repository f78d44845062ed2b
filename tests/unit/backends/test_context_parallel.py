"""Context parallelism's pieces against their definitions: the load-balanced split of a packed row,
the all-gathers that carry gradients, and attention over a split row, in a gloo world of 4 ranks
whose two groups of 2 (the second not starting at rank 0) each split one row."""

from __future__ import annotations

import multiprocessing
import os
import traceback

import pytest
import torch

from rlcore.backends.megatron.context_parallel import RowSplit, padded_length


def test_each_sequence_is_padded_to_2c_and_every_rank_holds_two_chunks_of_it() -> None:
    assert [padded_length(n, 2) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]
    assert [padded_length(n, 1) for n in (1, 5)] == [1, 5]
    split = RowSplit([8, 4], size=2, rank=0, group=None)
    assert split.chunks(0) == [(0, 0, 2), (0, 6, 2), (1, 8, 1), (1, 11, 1)]
    assert split.chunks(1) == [(0, 2, 2), (0, 4, 2), (1, 9, 1), (1, 10, 1)]
    held = torch.cat([split.index(r) for r in range(2)])
    assert sorted(held.tolist()) == list(range(12))  # every position once
    assert RowSplit([3, 5], size=1, rank=0, group=None).index().tolist() == list(range(8))


def _reference_attention(q, k, v, cu, scale):
    """Causal attention within each sequence of a whole row (q [n, heads, d], k/v [n, groups, d])."""
    rep = q.shape[1] // k.shape[1]
    out = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        qs, ks, vs = q[a:b].transpose(0, 1), k[a:b].repeat_interleave(rep, 1), v[a:b].repeat_interleave(rep, 1)
        o = torch.nn.functional.scaled_dot_product_attention(
            qs, ks.transpose(0, 1), vs.transpose(0, 1), is_causal=True, scale=scale
        )
        out.append(o.transpose(0, 1).reshape(b - a, -1))
    return torch.cat(out)


def _rank(rank: int, store_path: str, error_path: str) -> None:
    import torch.distributed as dist

    from rlcore.backends.common.collectives import all_gather_replicated, all_gather_summed
    from rlcore.backends.megatron.context_parallel import attend

    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=4)
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        group, me = groups[rank // 2], rank % 2

        # summed: each rank weighs the gathered parts its own way; a part's gradient sums the weights
        x = torch.full((3,), float(rank), requires_grad=True)
        weights = [torch.arange(6.0).reshape(2, 3) * (r + 1) for r in range(4)]
        (all_gather_summed(x, group) * weights[rank]).sum().backward()
        pair = [rank - me, rank - me + 1]
        assert x.grad is not None and torch.equal(x.grad, weights[pair[0]][me] + weights[pair[1]][me]), x.grad
        gathered = all_gather_replicated(x.detach().requires_grad_(), group)
        assert gathered[:, 0].tolist() == [float(r) for r in pair]

        # attention over a split row equals whole-row attention, values and gradients
        gen = torch.Generator().manual_seed(rank // 2)  # one row per group
        cu, heads, kv_heads, dim = [0, 8, 12, 20], 4, 2, 8
        q, k, v = (torch.randn(20, h, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
        out_weight = torch.randn(20, heads * dim, generator=gen)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        (_reference_attention(*full, cu, 0.3) * out_weight).sum().backward()
        split = RowSplit([8, 4, 8], size=2, rank=me, group=group)
        mine = split.index()
        local = [t[mine].clone().requires_grad_() for t in (q, k, v)]
        out = split.gather(attend(*local, cu, group, 0.3))
        torch.testing.assert_close(out, _reference_attention(q, k, v, cu, 0.3), atol=1e-5, rtol=1e-5)
        (out * out_weight).sum().backward()
        for got, want in zip(local, full, strict=True):
            assert got.grad is not None and want.grad is not None
            torch.testing.assert_close(got.grad, want.grad[mine], atol=1e-5, rtol=1e-5)
        dist.destroy_process_group()
    except BaseException:
        with open(f"{error_path}.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise


@pytest.mark.timeout(120)
def test_gathers_and_split_attention_in_a_group_that_does_not_start_at_rank_0(tmp_path) -> None:
    ctx = multiprocessing.get_context("spawn")
    errors = str(tmp_path / "error")
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), errors)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(100)
    failed = [open(f"{errors}.{r}").read() for r in range(4) if os.path.exists(f"{errors}.{r}")]
    assert not failed, failed[0]
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
