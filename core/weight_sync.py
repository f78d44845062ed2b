"""Weights from a trainer rank to rollout workers: metadata over gRPC, bytes over a process group.

    trainer rank 0 (group rank 0)                 rollout worker i (group rank i + 1)
    InitWeightSync(store address, world, rank) -> joins the group (once)
    BeginWeightUpdate(version, specs, bucket)  -> starts receiving in a thread, answers at once
    broadcast bucket 0 .. k-1                  -> unpacks each bucket into the engine's load_weights
    FinishWeightUpdate(version)                -> waits for the load, answers the version it serves

The group is standalone (its own TCP store and ProcessGroupGloo / ProcessGroupNCCL), never the
trainer's default group, so workers can join and leave without touching the trainer world. Tensors
are packed in order into flat byte buckets of at most `bucket_bytes` (a larger tensor travels
alone): one collective per bucket instead of one per tensor, and at most one bucket in flight.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..proto.v1 import common_pb2
from .rpc.errors import require

if TYPE_CHECKING:
    from ..client.rollout import RolloutClient

log = logging.getLogger("rlcore.weight_sync")

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_ALIGN = 16  # every tensor starts at a multiple of this in its bucket, so byte views can be retyped


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    """Key of DTYPES."""
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * DTYPES[self.dtype].itemsize

    def to_proto(self) -> common_pb2.TensorMeta:
        return common_pb2.TensorMeta(name=self.name, dtype=self.dtype, shape=list(self.shape))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spec_of(name: str, dtype: torch.dtype, shape: Iterable[int]) -> TensorSpec:
    return TensorSpec(name, dtype_name(dtype), tuple(int(d) for d in shape))


def specs_from_proto(metas: Iterable[common_pb2.TensorMeta], field: str = "tensors") -> list[TensorSpec]:
    specs = []
    for i, m in enumerate(metas):
        require(bool(m.name), f"{field}[{i}].name", "must be non-empty")
        require(
            m.dtype in DTYPES, f"{field}[{i}].dtype", f"must be one of {', '.join(DTYPES)}; got '{m.dtype}'"
        )
        require(
            all(d >= 0 for d in m.shape),
            f"{field}[{i}].shape",
            f"dimensions must be >= 0; got {list(m.shape)}",
        )
        specs.append(TensorSpec(m.name, m.dtype, tuple(m.shape)))
    require(len(specs) > 0, field, "must list at least one tensor")
    return specs


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Consecutive tensor indices per bucket: a bucket closes before the tensor that would push it
    past `bucket_bytes` (offsets aligned); a tensor larger than a bucket travels alone."""
    assert bucket_bytes > 0
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, spec in enumerate(specs):
        n = _aligned(spec.nbytes)
        if current and size + n > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


def _layout(specs: list[TensorSpec], bucket: list[int]) -> tuple[list[int], int]:
    """Byte offset of each tensor of a bucket and the bucket's total size."""
    offsets, size = [], 0
    for i in bucket:
        offsets.append(size)
        size += _aligned(specs[i].nbytes)
    return offsets, size


class SyncGroup:
    """A standalone process group for weight broadcast (rank 0 sends)."""

    def __init__(self, pg: Any, store: Any, rank: int, world_size: int, backend: str, timeout_s: float):
        self.pg, self.store = pg, store  # the store must outlive the group
        self.rank, self.world_size, self.backend, self.timeout_s = rank, world_size, backend, timeout_s
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )

    def broadcast(self, buf: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        self.pg.broadcast([buf], opts).wait()


def init_group(
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    backend: str,
    timeout_s: float,
    group_name: str,
    store: Any = None,
) -> SyncGroup:
    """Join (rank > 0) or host (rank 0, with its already-listening `store`) a weight-sync group.
    Blocks until every rank has joined or `timeout_s` passes."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_address, master_port, world_size, is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore(f"rlcore/weight_sync/{group_name}/", store)
    pg: Any
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    elif backend == "gloo":
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:
        raise ValueError(f"weight-sync backend must be gloo or nccl; got '{backend}'")
    group = SyncGroup(pg, store, rank, world_size, backend, timeout_s)
    # A first collective proves the mesh is complete (and warms up NCCL's communicator).
    group.broadcast(torch.zeros(1, dtype=torch.uint8, device=group.device))
    return group


def receive_weights(
    group: SyncGroup, specs: list[TensorSpec], bucket_bytes: int, device: str, stats: dict[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive every bucket from rank 0 and yield (name, tensor) views into it, bucket by bucket.
    Fills stats: num_bytes, receive_s (time blocked in the group)."""
    stats["num_bytes"] = stats["receive_s"] = 0.0
    for bucket in plan_buckets(specs, bucket_bytes):
        offsets, size = _layout(specs, bucket)
        buf = torch.empty(size, dtype=torch.uint8, device=group.device)
        start = time.perf_counter()
        group.broadcast(buf)
        stats["receive_s"] += time.perf_counter() - start
        stats["num_bytes"] += size
        if buf.device != torch.device(device):
            buf = buf.to(device)
        for i, off in zip(bucket, offsets, strict=True):
            spec = specs[i]
            yield spec.name, buf[off : off + spec.nbytes].view(DTYPES[spec.dtype]).view(spec.shape)


def send_weights(
    group: SyncGroup, specs: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> dict[str, float]:
    """Pack `weights` (in `specs` order) into buckets and broadcast each one; returns num_bytes,
    gather_s (waiting for the next tensor: the strategy's all-gather), send_s (in the group)."""
    stats = {"num_bytes": 0.0, "gather_s": 0.0, "send_s": 0.0}
    it = iter(weights)
    for b, bucket in enumerate(plan_buckets(specs, bucket_bytes)):
        offsets, size = _layout(specs, bucket)
        buf = torch.empty(size, dtype=torch.uint8, device=group.device)
        for i, off in zip(bucket, offsets, strict=True):
            start = time.perf_counter()
            name, tensor = next(it)
            stats["gather_s"] += time.perf_counter() - start
            spec = specs[i]
            if (
                name != spec.name
                or dtype_name(tensor.dtype) != spec.dtype
                or tuple(tensor.shape) != spec.shape
            ):
                raise RuntimeError(
                    f"weight {i} is {name} {dtype_name(tensor.dtype)} {tuple(tensor.shape)} but the announced "
                    f"spec is {spec.name} {spec.dtype} {spec.shape}: the strategy's weight_specs() and "
                    f"iter_full_weights() disagree"
                )
            buf[off : off + spec.nbytes].copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))
        start = time.perf_counter()
        try:
            group.broadcast(buf)
        except RuntimeError as e:
            raise RuntimeError(f"sending bucket {b} ({size} bytes) failed: {e}") from e
        stats["send_s"] += time.perf_counter() - start
        stats["num_bytes"] += size
    leftover = next(it, None)
    assert leftover is None, f"iter_full_weights yielded {leftover[0]} beyond the announced specs"
    return stats


class WeightSender:
    """Trainer rank 0's side: forms the group with the workers once, then pushes versions."""

    def __init__(
        self,
        clients: list[RolloutClient],
        *,
        backend: str,
        timeout_s: float,
        bucket_bytes: int,
        master_address: str = "127.0.0.1",
    ):
        assert clients, "no rollout workers to sync"
        self.clients = clients
        self.backend, self.timeout_s, self.bucket_bytes = backend, timeout_s, bucket_bytes
        self.master_address = master_address
        self.group: SyncGroup | None = None
        self._pool = ThreadPoolExecutor(max_workers=len(clients))

    def _ensure_group(self) -> SyncGroup:
        if self.group is not None:
            return self.group
        world = len(self.clients) + 1
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(
            self.master_address, 0, world, is_master=True, timeout=timeout, wait_for_workers=False
        )
        name = f"{store.port}-{time.time_ns()}"
        joins = [
            self._pool.submit(
                c.init_weight_sync,
                self.master_address,
                store.port,
                world,
                rank + 1,
                self.backend,
                self.timeout_s,
                name,
                timeout=self.timeout_s,
            )  # fmt: skip
            for rank, c in enumerate(self.clients)
        ]
        try:
            group = init_group(
                self.master_address, store.port, world, 0, self.backend, self.timeout_s, name, store
            )
        except RuntimeError as e:
            failed = [
                c.address for c, f in zip(self.clients, joins, strict=True) if f.done() and f.exception()
            ]
            reasons = "; ".join(str(f.exception()) for f in joins if f.done() and f.exception())
            raise RuntimeError(
                f"weight-sync group did not form within {self.timeout_s:g} s (synchronizer.sync_timeout); "
                f"workers that failed to join: {', '.join(failed) or 'none reported'} {reasons} ({e})"
            ) from e
        for c, f in zip(self.clients, joins, strict=True):
            f.result(timeout=self.timeout_s)  # surfaces a worker's error, naming it through RpcError
            log.info("weight-sync group formed with %s", c.address)
        self.group = group
        return group

    def send(
        self, specs: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> dict[str, float]:
        """Announce, broadcast and confirm one version on every worker; returns timings and bytes."""
        start = time.perf_counter()
        group = self._ensure_group()
        expected = len(plan_buckets(specs, self.bucket_bytes))
        begins = [
            self._pool.submit(
                c.begin_weight_update, policy_version, specs, self.bucket_bytes, timeout=self.timeout_s
            )
            for c in self.clients
        ]
        for c, f in zip(self.clients, begins, strict=True):
            got = f.result()
            assert got == expected, f"{c.address} plans {got} buckets, the sender {expected}"
        try:
            stats = send_weights(group, specs, weights, self.bucket_bytes)
        except RuntimeError as e:
            self.group = None  # the group is unusable after a failed collective; re-form next time
            raise RuntimeError(
                f"weight sync of version {policy_version} to {', '.join(c.address for c in self.clients)} "
                f"failed in phase send: {e}"
            ) from e
        finishes = [
            self._pool.submit(c.finish_weight_update, policy_version, timeout=self.timeout_s)
            for c in self.clients
        ]
        load_s = 0.0
        for f in finishes:
            answer = f.result()
            assert answer.policy_version == policy_version
            load_s = max(load_s, answer.load_s)
        stats["load_s"] = load_s
        stats["total_s"] = time.perf_counter() - start
        return stats

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.group = None
