"""Packed attention off the GPU (backends/common/attention.py `_per_sequence`): the sequences of one
length attend in one batched call (where lengths repeat enough), and every output and gradient is
bit for bit what one call per sequence gives (the numbers of runs before the grouping stay the same)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from rlcore.backends.common import attention
from rlcore.backends.common.attention import _per_sequence


def one_call_per_sequence(query, key, value, cu, scaling):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    outs = [
        F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling
        )
        for a, b in zip(cu[:-1], cu[1:], strict=True)
        if b > a
    ]
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("grouped_from", [1, attention.GROUPED_FROM])  # 1: every row grouped
@pytest.mark.parametrize("seed", range(6))
def test_grouped_by_length_is_bitwise_one_call_per_sequence(
    seed: int, grouped_from: int, monkeypatch
) -> None:
    monkeypatch.setattr(attention, "GROUPED_FROM", grouped_from)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    lengths = [rng.choice([0, 1, 2, 5, 12, 13, 20, 33]) for _ in range(rng.randint(2, 30))] + [7]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    heads, kv_heads, dim = 4, rng.choice([4, 2, 1]), 16
    query = torch.randn(1, heads, cu[-1], dim, requires_grad=True)
    key = torch.randn(1, kv_heads, cu[-1], dim, requires_grad=True)
    value = torch.randn(1, kv_heads, cu[-1], dim, requires_grad=True)
    scaling = rng.choice([None, 0.1])

    grouped = _per_sequence(query, key, value, cu, 0.0, scaling)
    alone = one_call_per_sequence(query, key, value, cu, scaling)
    assert torch.equal(grouped, alone)
    upstream = torch.randn_like(alone)
    for a, b in zip(
        torch.autograd.grad(grouped, (query, key, value), upstream),
        torch.autograd.grad(alone, (query, key, value), upstream),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_a_right_padded_batch_is_one_call() -> None:
    query, key, value = torch.randn(3, 4, 9, 8), torch.randn(3, 2, 9, 8), torch.randn(3, 2, 9, 8)
    out = _per_sequence(query, key, value, [0, 9], 0.0, None)
    assert torch.equal(out, one_call_per_sequence(query, key, value, [0, 9], None))
