"""Bucket planning and a real two-rank gloo weight-sync group (two threads of this process)."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlcore.weights.wire import (
    RECEIVE_POOL,
    SyncGroup,
    TensorSpec,
    WeightCorruption,
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


def test_tensors_of_a_mebibyte_travel_alone_even_in_large_buckets() -> None:
    specs = [
        TensorSpec("norm", "float32", (10,)),
        TensorSpec("proj", "float32", (1 << 18,)),  # exactly SOLO_BYTES
        TensorSpec("bias", "float32", (10,)),
        TensorSpec("bias2", "float32", (10,)),
    ]
    assert plan_buckets(specs, 64 << 20) == [[0], [1], [2, 3]]


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

    no_peers = SyncGroup(None, None, 0, 1, "gloo", 1.0)  # the check happens before anything is sent
    with pytest.raises(RuntimeError, match="norm.weight bfloat16 .* announced spec is norm.weight float32"):
        send_weights(no_peers, specs, iter(weights), 1 << 20)


def _pair(name: str, timeout_s: float) -> tuple[SyncGroup, SyncGroup]:
    """A sender group (rank 0) and a receiver group (rank 1) formed in this process."""
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))  # fmt: skip
    box: list[SyncGroup] = []
    thread = threading.Thread(
        target=lambda: box.append(init_group("127.0.0.1", store.port, 2, 1, "gloo", timeout_s, name))
    )
    thread.start()
    sender = init_group("127.0.0.1", store.port, 2, 0, "gloo", timeout_s, name, store=store)
    thread.join(30)
    return sender, box[0]


def _transfer(
    sender: SyncGroup,
    receiver: SyncGroup,
    specs: list[TensorSpec],
    weights: list,
    bucket: int,
    checksums: bool,
    **receive_options: Any,
) -> tuple[list[tuple[str, torch.Tensor]], dict[str, float], list[BaseException]]:
    """Send `weights` from `sender` while a thread receives them on `receiver`: (what was yielded,
    the receiver's stats with the sender's under "sent_<key>", errors raised on the receiving side)."""
    received: list[tuple[str, torch.Tensor]] = []
    stats: dict[str, float] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for name, t in receive_weights(
                receiver, specs, bucket, "cpu", stats, checksums=checksums, version=3, **receive_options
            ):
                received.append((name, t.clone()))
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    sent = send_weights(sender, specs, iter(weights), bucket, checksums=checksums)
    thread.join(30)
    stats.update({f"sent_{k}": v for k, v in sent.items()})
    return received, stats, errors


@pytest.mark.timeout(60)
def test_checksummed_transfer_is_bit_exact_and_checks_every_bucket() -> None:
    weights = _weights()
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    sender, receiver = _pair("crc-ok", 30.0)
    received, stats, errors = _transfer(sender, receiver, specs, weights, 1024, checksums=True)
    assert not errors, errors
    for (_, a), (_, b) in zip(received, weights, strict=True):
        assert torch.equal(a, b)
    assert stats["verified_buckets"] == len(plan_buckets(specs, 1024))


@pytest.mark.timeout(60)
def test_a_corrupted_bucket_is_detected_and_nothing_is_delivered() -> None:
    weights = _weights()
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    plan = plan_buckets(specs, 1024)
    sender, receiver = _pair("crc-bad", 30.0)
    real = sender.broadcast_async
    sent = [0]

    def flip_a_byte_of_bucket_1(buf: torch.Tensor):  # damage on the wire, after the checksum was sealed
        if sent[0] == 1:
            buf[3] ^= 0x10
        sent[0] += 1
        return real(buf)

    sender.broadcast_async = flip_a_byte_of_bucket_1  # type: ignore[method-assign]
    received, _, errors = _transfer(sender, receiver, specs, weights, 1024, checksums=True)
    assert received == []  # the engine would have loaded nothing: it keeps its last good version
    (error,) = errors
    assert isinstance(error, WeightCorruption)
    first, last = specs[plan[1][0]].name, specs[plan[1][-1]].name
    assert error.bad == [(1, first, last)]
    assert (
        f"version 3: 1 of {len(plan)} bucket(s) failed their checksum: bucket 1 ({first} .. {last})"
        in str(error)
    )

    # Without checksums the same damage goes through unnoticed: that is what the option is for.
    sent[0] = 0
    received, _, errors = _transfer(sender, receiver, specs, weights, 1024, checksums=False)
    assert not errors and any(not torch.equal(a, b) for (_, a), (_, b) in zip(received, weights, strict=True))


@pytest.mark.timeout(60)
def test_a_stalled_receiver_becomes_an_error_within_the_group_timeout() -> None:
    weights = _weights()
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    sender, _receiver = _pair("stall", 2.0)  # the receiver joined, then never receives
    start = time.perf_counter()
    # With two broadcasts in flight, either bucket's timeout may fire first: gloo then closes the
    # pair and the other reports "Application timeout caused pair closure".
    timed_out = r"([Tt]imed out|Application timeout)"
    with pytest.raises(RuntimeError, match=r"sending bucket 0 of \d+ \(\d+ bytes\) failed: .*" + timed_out):
        send_weights(sender, specs, iter(weights), 1024)
    assert time.perf_counter() - start < 2.0 + 3.0


@pytest.mark.timeout(60)
def test_large_tensors_go_uncopied_from_the_senders_storage_into_the_engines_tensors() -> None:
    sender, receiver = _pair("direct", 30.0)
    bucket = 1024  # embed and head (2368 B each) travel alone
    # The engine's own tensors: embed matches (received in place), head is bf16 (goes through the
    # consumer, which converts), norm is small (packed, so always through the consumer).
    targets = {
        "embed.weight": torch.zeros(37, 16),
        "head.weight": torch.zeros(16, 37, dtype=torch.bfloat16),
        "norm.weight": torch.zeros(16, dtype=torch.bfloat16),
    }
    for version in (1, 2):  # the second sync reuses the buffers of the first
        g = torch.Generator().manual_seed(version)
        weights = [(n, (t + torch.randn(t.shape, generator=g)).to(t.dtype)) for n, t in _weights()]
        weights[3] = ("head.weight", torch.randn(37, 16, generator=g).t())  # non-contiguous: packed
        specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
        received, stats, errors = _transfer(sender, receiver, specs, weights, bucket, False, into=targets.get)
        assert not errors, errors
        assert torch.equal(targets["embed.weight"], weights[0][1])  # written by the receive itself
        assert [n for n, _ in received] == [n for n, _ in weights if n != "embed.weight"]
        expected = dict(weights)
        for name, t in received:
            assert torch.equal(t, expected[name].contiguous()), name
        # head was packed (not contiguous); step, alone in the last bucket, went from its storage
        assert stats["sent_direct_bytes"] == weights[0][1].nbytes + weights[4][1].nbytes
        assert stats["direct_bytes"] == weights[0][1].nbytes
        assert stats["sent_num_bytes"] == stats["num_bytes"]


def _many_buckets() -> tuple[list[tuple[str, torch.Tensor]], list[TensorSpec], int]:
    """24 tensors of 120 B in buckets of 256 B: 12 buckets, more than RECEIVE_POOL and STAGING."""
    g = torch.Generator().manual_seed(0)
    weights = [(f"w{i}", torch.randn(30, generator=g)) for i in range(24)]
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    assert len(plan_buckets(specs, 256)) == 12 > RECEIVE_POOL
    return weights, specs, 256


def _sync_to(
    consumer: Any, sender: SyncGroup, receiver: SyncGroup, weights: list, specs: list, bucket: int
) -> None:
    """One sync: the receiver's tensors go to `consumer(name, tensor)` in a thread."""
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for name, t in receive_weights(receiver, specs, bucket, "cpu", {}):
                consumer(name, t)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    send_weights(sender, specs, iter(weights), bucket)
    thread.join(30)
    assert not errors, errors


def test_the_receive_pool_hands_out_only_buffers_nobody_views_and_keeps_at_most_its_size() -> None:
    group = SyncGroup(None, None, 1, 2, "gloo", 1.0)  # the pool needs no process group

    def base(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    held = [group.receive_buffer(100) for _ in range(RECEIVE_POOL)]
    kept = {base(t) for t in held}
    assert len(kept) == RECEIVE_POOL  # each one stays taken while a view into it lives
    assert base(group.receive_buffer(100)) not in kept  # all taken: a fresh buffer, not kept
    released = base(held.pop())
    assert base(group.receive_buffer(50)) == released  # a smaller request fits in a free buffer
    bigger = group.receive_buffer(200)  # nothing free fits: the free 100-byte buffer makes room
    big = base(bigger)
    assert big not in kept
    del bigger
    assert base(group.receive_buffer(150)) == big  # the 200-byte buffer was kept, and is reused
    assert base(group.receive_buffer(100)) != released  # the dropped one is gone from the pool


@pytest.mark.timeout(60)
def test_tensors_the_engine_still_holds_are_never_overwritten_by_later_buckets() -> None:
    """vLLM's layerwise reload keeps a layer's tensors (views into the received buckets) until the
    layer is complete. Here the consumer keeps every tensor, uncopied, and takes its time, while
    the sender's next buckets arrive: a buffer still viewed must not receive another bucket."""
    sender, receiver = _pair("hold", 30.0)
    weights, specs, bucket = _many_buckets()
    held: list[tuple[str, torch.Tensor]] = []

    def keep(name: str, t: torch.Tensor) -> None:
        time.sleep(0.01)  # a slow load: the sender's next buckets arrive meanwhile
        held.append((name, t))

    _sync_to(keep, sender, receiver, weights, specs, bucket)
    assert [n for n, _ in held] == [n for n, _ in weights]
    for (name, a), (_, b) in zip(held, weights, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.timeout(60)
def test_receive_buffers_are_reused_once_the_engine_lets_go_of_their_tensors() -> None:
    """A consumer that copies each tensor (the HF engine's load_weights): every bucket of both syncs
    lands in a buffer the receiver keeps, and 24 buckets in at most RECEIVE_POOL buffers is reuse.

    How many buffers a sync needs is not fixed: IN_FLIGHT posted, the one being yielded and the
    consumer's last tensor, plus, on a loaded machine, one whose broadcast gloo's worker thread has
    not let go of yet (it drops its reference a moment after wait() returns; seen in CI)."""
    sender, receiver = _pair("reuse", 30.0)
    weights, specs, bucket = _many_buckets()

    def kept() -> set[int]:
        return {b.untyped_storage().data_ptr() for b in receiver._pool}

    kept_before: set[int] = set()
    for version in (1, 2):
        got: list[tuple[str, torch.Tensor]] = []
        buffers: set[int] = set()

        def copy(name: str, t: torch.Tensor, got: list = got, buffers: set = buffers) -> None:
            buffers.add(t.untyped_storage().data_ptr())
            got.append((name, t.clone()))

        _sync_to(copy, sender, receiver, [(n, t * version) for n, t in weights], specs, bucket)
        assert [n for n, _ in got] == [n for n, _ in weights]
        for (name, a), (_, b) in zip(got, weights, strict=True):
            assert torch.equal(a, b * version), name
        assert buffers <= kept(), "a bucket was received into a buffer the pool does not keep"
        assert kept_before <= kept(), "a buffer was dropped from a pool that was not full"
        kept_before = kept()
    assert len(kept_before) <= RECEIVE_POOL < 2 * len(plan_buckets(specs, bucket))


@pytest.mark.timeout(60)
def test_with_checksums_nothing_is_received_into_the_engines_tensors() -> None:
    weights = _weights()
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    sender, receiver = _pair("crc-direct", 30.0)
    target = torch.zeros(37, 16)
    received, stats, errors = _transfer(
        sender, receiver, specs, weights, 1024, True, into={"embed.weight": target}.get
    )
    assert not errors, errors
    assert [n for n, _ in received] == [n for n, _ in weights]  # everything staged and verified first
    assert stats["direct_bytes"] == 0 and not target.any()
