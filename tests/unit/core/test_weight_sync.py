"""Bucket planning and a real two-rank gloo weight-sync group (two threads of this process)."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from rlcore.core.weight_sync import (
    TensorSpec,
    init_group,
    plan_buckets,
    receive_weights,
    send_weights,
    spec_of,
)


def test_buckets_close_before_overflow_and_big_tensors_travel_alone() -> None:
    # float32 sizes: 40 B -> 48 aligned, 400 B -> 400, 8 B -> 16
    specs = [
        TensorSpec("a", "float32", (10,)),
        TensorSpec("b", "float32", (10,)),
        TensorSpec("big", "float32", (100,)),
        TensorSpec("c", "float32", (2,)),
    ]
    # 48 + 48 = 96 <= 100 fits; big (400) overflows and is alone; c starts a new bucket
    assert plan_buckets(specs, 100) == [[0, 1], [2], [3]]
    assert plan_buckets(specs, 10_000) == [[0, 1, 2, 3]]
    assert plan_buckets(specs, 1) == [[0], [1], [2], [3]]


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(37, 16, generator=g)),
        ("norm.weight", torch.randn(16, generator=g).to(torch.bfloat16)),
        ("odd", torch.randn(3, 5, 7, generator=g).to(torch.float16)),
        ("head.weight", torch.randn(16, 37, generator=g)),
        ("step", torch.tensor([7], dtype=torch.int64)),
    ]


@pytest.mark.timeout(60)
def test_gloo_group_moves_every_tensor_bit_exact() -> None:
    weights = _weights()
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    bucket = 1024  # several buckets, and embed (2368 B) larger than one
    assert len(plan_buckets(specs, bucket)) >= 3
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))  # fmt: skip
    received: list[tuple[str, torch.Tensor]] = []
    stats: dict[str, float] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            group = init_group("127.0.0.1", store.port, 2, 1, "gloo", 30.0, "t")
            for name, t in receive_weights(group, specs, bucket, "cpu", stats):
                received.append((name, t.clone()))
        except BaseException as e:  # surfaced by the assert below
            errors.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    group = init_group("127.0.0.1", store.port, 2, 0, "gloo", 30.0, "t", store=store)
    sent = send_weights(group, specs, iter(weights), bucket)
    thread.join(30)
    assert not errors, errors
    assert [n for n, _ in received] == [n for n, _ in weights]
    for (_, a), (_, b) in zip(received, weights, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert sent["num_bytes"] == stats["num_bytes"] >= sum(s.nbytes for s in specs)


def test_sender_refuses_weights_that_disagree_with_the_specs() -> None:
    weights = _weights()
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    specs[1] = TensorSpec("norm.weight", "float32", (16,))  # announced fp32, the strategy yields bf16

    class NoGroup:  # the check happens before anything is sent
        device = torch.device("cpu")

        def broadcast(self, buf: torch.Tensor) -> None:
            pass

    with pytest.raises(RuntimeError, match="norm.weight bfloat16 .* announced spec is norm.weight float32"):
        send_weights(NoGroup(), specs, iter(weights), 1 << 20)  # type: ignore[arg-type]
