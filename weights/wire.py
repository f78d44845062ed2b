"""Weights from a trainer rank to rollout workers: metadata over gRPC, bytes over a process group.

    trainer rank 0 (group rank 0)                 rollout worker i (group ranks r_i .. r_i + n_i - 1)
    InitWeightSync(store address, world, r_i)  -> its n_i engine processes join the group (once)
    BeginWeightUpdate(version, specs, bucket)  -> starts receiving in a thread, answers at once
    broadcast bucket 0 .. k-1                  -> unpacks each bucket into the engine's load_weights
    FinishWeightUpdate(version)                -> waits for the load, answers the version it serves

n_i is the worker's weight_sync_ranks: 1 for the embedded HF engine (its server process receives),
the tensor-parallel size for vLLM (each vLLM worker process receives every bucket itself and loads
its shard). With checksums each bucket carries a CRC-32 trailer, checked on every receiving rank
before anything is loaded.

The group is standalone (its own TCP store and ProcessGroupGloo / ProcessGroupNCCL), never the
trainer's default group, so workers can join and leave without touching the trainer world. Small
tensors are packed in order into flat byte buckets of at most `bucket_bytes`: one collective per
bucket instead of one per tensor. A tensor of at least SOLO_BYTES (or a whole bucket, if smaller)
travels alone and without copies: broadcast from its own storage, and received straight into the
engine's parameter when the engine offers one of the same dtype and shape (`into`; the HF engine
does, vLLM's fused parameters do not). IN_FLIGHT (2) buckets are on the wire at once while the
next one is gathered and packed, or the last one received is loaded; on CPU the receiving side
reuses its buffers once the engine holds no tensor from them. With checksums every bucket
is packed and staged, so nothing is written into the engine before all of them check out. The gRPC
calls around the bytes are in sender.py (trainer) and receiver.py (worker).
"""

from __future__ import annotations

import datetime
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..core.rpc.errors import require
from ..proto.v1 import common_pb2

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
SOLO_BYTES = 1 << 20
"""Tensors this large travel alone, unpacked: a copy costs more than a collective's fixed overhead."""
IN_FLIGHT = 2
"""Broadcasts posted at once: the next one's start overlaps the current one's transfer (on gloo, a
collective's fixed cost is about that of 1 MB on the wire). At 10M parameters on a 2-core CPU
machine one in flight reached 0.70-1.00 of the raw broadcast (median 0.80 over 4 runs), two 0.87-0.93."""
STAGING = IN_FLIGHT + 1
"""The sender's staging buffers: one being packed while IN_FLIGHT are on the wire."""
RECEIVE_POOL = 8
"""Receive buffers a CPU group keeps between buckets and syncs (SyncGroup.receive_buffer): IN_FLIGHT
posted, plus what the engine still holds (vLLM's reload keeps a layer's tensors until the layer is
complete), plus one whose finished broadcast gloo's worker thread has not let go of yet (it drops its
reference a moment after wait() returns, later on a loaded machine)."""


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
    """Consecutive tensor indices per bucket. A tensor of at least min(SOLO_BYTES, bucket_bytes)
    travels alone; smaller ones are packed, a bucket closing before the tensor that would push it
    past `bucket_bytes` (offsets aligned)."""
    assert bucket_bytes > 0
    solo = min(SOLO_BYTES, bucket_bytes)
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, spec in enumerate(specs):
        n = _aligned(spec.nbytes)
        if current and (spec.nbytes >= solo or size + n > bucket_bytes):
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
        if spec.nbytes >= solo:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def bucket_layout(specs: list[TensorSpec], bucket: list[int], checksums: bool) -> tuple[list[int], int]:
    """Byte offset of each tensor of a bucket and the bytes on the wire: the tensors, each at an
    aligned offset, then the checksum trailer when `checksums` (a lone tensor without checksums
    travels as exactly its own bytes)."""
    offsets, end = [], 0
    for i in bucket:
        offset = _aligned(end)
        offsets.append(offset)
        end = offset + specs[i].nbytes
    return offsets, (_aligned(end) + _ALIGN if checksums else end)


def bucket_checksum(payload: torch.Tensor) -> int:
    """CRC-32 of a byte tensor (copied to the host first when it lives on a GPU)."""
    host = payload if payload.device.type == "cpu" else payload.cpu()
    return zlib.crc32(host.numpy().data)


def _seal(buf: torch.Tensor) -> None:
    """Write the payload's checksum into the bucket's trailer."""
    crc = torch.tensor([bucket_checksum(buf[:-_ALIGN])], dtype=torch.int64)
    buf[-_ALIGN : -_ALIGN + 8].copy_(crc.view(torch.uint8))


def _checksum_ok(buf: torch.Tensor) -> bool:
    stored = int(buf[-_ALIGN : -_ALIGN + 8].cpu().view(torch.int64)[0])
    return stored == bucket_checksum(buf[:-_ALIGN])


class WeightCorruption(RuntimeError):
    """Received buckets failed their checksums; nothing was loaded."""

    def __init__(self, version: int, bad: list[tuple[int, str, str]], num_buckets: int):
        self.bad = bad
        names = "; ".join(f"bucket {b} ({first} .. {last})" for b, first, last in bad)
        super().__init__(
            f"version {version}: {len(bad)} of {num_buckets} bucket(s) failed their checksum: {names}"
        )


class WeightSyncError(RuntimeError):
    """A weight sync failed or missed its deadline; the message names the worker and the phase."""


_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _unviewed(buf: torch.Tensor) -> bool:
    """Whether no tensor but `buf` refers to its memory: `buf` and its storage's Python object hold
    one reference each, every view one more."""
    assert _STORAGE_USE_COUNT is not None
    return int(_STORAGE_USE_COUNT(buf.untyped_storage()._cdata)) <= 2


class SyncGroup:
    """A standalone process group for weight broadcast (rank 0 sends)."""

    def __init__(self, pg: Any, store: Any, rank: int, world_size: int, backend: str, timeout_s: float):
        self.pg, self.store = pg, store  # the store must outlive the group
        self.rank, self.world_size, self.backend, self.timeout_s = rank, world_size, backend, timeout_s
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        self._staging: list[torch.Tensor] = []
        self._pool: list[torch.Tensor] = []

    def staging_buffers(self, nbytes: int) -> list[torch.Tensor]:
        """STAGING bucket buffers of at least `nbytes` each for the sender to pack into, kept from
        one sync to the next: fresh memory would cost a page fault per 4 KiB on every sync."""
        if not self._staging or self._staging[0].numel() < nbytes:
            self._staging = []  # free the old set before allocating the new one
            self._staging = [
                torch.empty(nbytes, dtype=torch.uint8, device=self.device) for _ in range(STAGING)
            ]
        return self._staging

    def receive_buffer(self, nbytes: int) -> torch.Tensor:
        """A buffer of `nbytes` to receive a bucket into; it stays taken for as long as any view
        into it lives (the caller's, the engine's). On CPU it comes from a pool of RECEIVE_POOL
        buffers reused once no view into them is left: fresh memory costs a page fault per 4 KiB,
        about 0.4 s per GB on a 2-core AMD EPYC VM (five times the copy itself). On CUDA the caching
        allocator already hands freed blocks back, and a pool would hold GPU memory between syncs."""
        if self.device.type != "cpu" or _STORAGE_USE_COUNT is None:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        free = [b for b in self._pool if b.numel() >= nbytes and _unviewed(b)]
        if free:
            return min(free, key=lambda b: b.numel())[:nbytes]
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if len(self._pool) >= RECEIVE_POOL:  # make room by dropping the smallest idle buffer
            idle = [i for i, b in enumerate(self._pool) if _unviewed(b)]
            if not idle:
                return buf[:nbytes]  # every kept buffer is taken: this one is not kept
            del self._pool[min(idle, key=lambda i: self._pool[i].numel())]
        self._pool.append(buf)
        return buf[:nbytes]  # a view: while the caller holds it, the pool sees the buffer taken

    def broadcast_async(self, buf: torch.Tensor) -> Any:
        """Start broadcasting `buf` from rank 0; returns the work to wait() on."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        return self.pg.broadcast([buf], opts)

    def broadcast(self, buf: torch.Tensor) -> None:
        self.broadcast_async(buf).wait()


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


def _tensors(
    specs: list[TensorSpec], bucket: list[int], offsets: list[int], buf: torch.Tensor, device: str
) -> Iterator[tuple[str, torch.Tensor]]:
    if buf.device != torch.device(device):
        buf = buf.to(device)
    for i, off in zip(bucket, offsets, strict=True):
        spec = specs[i]
        yield spec.name, buf[off : off + spec.nbytes].view(DTYPES[spec.dtype]).view(spec.shape)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The flat uint8 view of a contiguous tensor's storage."""
    return tensor.reshape(-1).view(torch.uint8)


def _direct_target(
    spec: TensorSpec, into: Callable[[str], torch.Tensor | None] | None, device: torch.device
) -> torch.Tensor | None:
    """The engine's own tensor for `spec`, when the bytes can be received straight into it."""
    target = into(spec.name) if into is not None else None
    if (
        target is None
        or target.dtype != DTYPES[spec.dtype]
        or tuple(target.shape) != spec.shape
        or not target.is_contiguous()
        or target.device != device
    ):
        return None
    return target


def receive_weights(
    group: SyncGroup,
    specs: list[TensorSpec],
    bucket_bytes: int,
    device: str,
    stats: dict[str, float],
    *,
    checksums: bool = False,
    version: int = 0,
    into: Callable[[str], torch.Tensor | None] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive every bucket from rank 0 and yield (name, tensor) views into it.

    Without checksums each bucket is yielded as it arrives, while the next one is already being
    received (IN_FLIGHT buckets posted at once). A lone tensor for which `into(name)` returns a
    tensor of the same dtype and shape (contiguous, on the group's device) is received straight into
    that tensor and not yielded. The rest lands in `group.receive_buffer`s, which are reused only
    once the consumer has let go of every tensor yielded from them: a consumer may keep tensors
    across buckets (vLLM's layerwise reload holds a layer's until the layer is complete).

    With checksums every bucket is received (each into a buffer of its own) and checked before the
    first tensor is yielded, so a corrupted transfer raises WeightCorruption with nothing loaded
    (at the cost of holding the whole model in received buckets); `into` is ignored.
    Fills stats: num_bytes, direct_bytes (received in place), receive_s (time blocked in the
    group), verified_buckets. On NCCL, wait() only makes the current stream wait for the transfer
    and returns at once, so receive_s is host time and the transfer shows in what the caller times
    next (its load).
    """
    for key in ("num_bytes", "direct_bytes", "receive_s", "verified_buckets"):
        stats[key] = 0.0
    plan = plan_buckets(specs, bucket_bytes)
    layouts = [bucket_layout(specs, bucket, checksums) for bucket in plan]
    if checksums:
        into = None

    def post(b: int) -> tuple[torch.Tensor, Any, bool]:
        size = layouts[b][1]
        target = _direct_target(specs[plan[b][0]], into, group.device) if len(plan[b]) == 1 else None
        buf = _as_bytes(target) if target is not None else group.receive_buffer(size)
        return buf, group.broadcast_async(buf), target is not None

    def wait(b: int, pending: tuple[torch.Tensor, Any, bool]) -> torch.Tensor:
        buf, work, direct = pending
        start = time.perf_counter()
        try:
            work.wait()
        except RuntimeError as e:
            raise RuntimeError(
                f"receiving bucket {b} of {len(plan)} ({buf.numel()} bytes) failed: {e}"
            ) from e
        stats["receive_s"] += time.perf_counter() - start
        stats["num_bytes"] += buf.numel()
        if direct:
            stats["direct_bytes"] += buf.numel()
        return buf

    if checksums:
        received = []
        for b in range(len(plan)):
            received.append(wait(b, post(b)))
        bad = [
            (b, specs[plan[b][0]].name, specs[plan[b][-1]].name)
            for b, buf in enumerate(received)
            if not _checksum_ok(buf)
        ]
        stats["verified_buckets"] = float(len(plan))
        if bad:
            raise WeightCorruption(version, bad, len(plan))
        for b, buf in enumerate(received):
            yield from _tensors(specs, plan[b], layouts[b][0], buf, device)
        return

    pending = deque(post(b) for b in range(min(IN_FLIGHT, len(plan))))
    for b in range(len(plan)):
        entry = pending.popleft()
        buf = wait(b, entry)
        if b + IN_FLIGHT < len(plan):  # overlaps the caller's load of bucket b
            pending.append(post(b + IN_FLIGHT))
        if not entry[2]:
            yield from _tensors(specs, plan[b], layouts[b][0], buf, device)


def send_weights(
    group: SyncGroup,
    specs: list[TensorSpec],
    weights: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    *,
    checksums: bool = False,
) -> dict[str, float]:
    """Broadcast `weights` (in `specs` order) bucket by bucket, gathering and packing the next bucket
    while the previous IN_FLIGHT are on the wire (STAGING buffers). Without checksums a lone tensor
    that is contiguous and on the group's device is sent from its own storage, uncopied (the
    strategy must not overwrite a yielded tensor before the iterator is exhausted). Returns
    num_bytes, direct_bytes (sent uncopied), gather_s (waiting for the next tensor: the strategy's
    all-gather), pack_s (copying into buckets and checksums), send_s (blocked in the group; on NCCL
    only host time, as in receive_weights)."""
    stats = {"num_bytes": 0.0, "direct_bytes": 0.0, "gather_s": 0.0, "pack_s": 0.0, "send_s": 0.0}
    plan = plan_buckets(specs, bucket_bytes)
    layouts = [bucket_layout(specs, bucket, checksums) for bucket in plan]
    packed = [size for bucket, (_, size) in zip(plan, layouts, strict=True) if len(bucket) > 1 or checksums]
    group.staging_buffers(max(packed, default=0))  # allocated once, not grown bucket by bucket
    it = iter(weights)
    in_flight: deque[tuple[int, torch.Tensor, Any]] = deque()
    packed_count = 0

    def next_tensor(i: int) -> torch.Tensor:
        start = time.perf_counter()
        name, tensor = next(it)
        stats["gather_s"] += time.perf_counter() - start
        spec = specs[i]
        if name != spec.name or dtype_name(tensor.dtype) != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise RuntimeError(
                f"weight {i} is {name} {dtype_name(tensor.dtype)} {tuple(tensor.shape)} but the announced "
                f"spec is {spec.name} {spec.dtype} {spec.shape}: the strategy's weight_specs() and "
                f"iter_full_weights() disagree"
            )
        return tensor.detach()

    def finish(flight: tuple[int, torch.Tensor, Any]) -> None:
        b, buf, work = flight
        start = time.perf_counter()
        try:
            work.wait()
        except RuntimeError as e:
            raise RuntimeError(f"sending bucket {b} of {len(plan)} ({buf.numel()} bytes) failed: {e}") from e
        stats["send_s"] += time.perf_counter() - start
        stats["num_bytes"] += buf.numel()

    for b, (bucket, (offsets, size)) in enumerate(zip(plan, layouts, strict=True)):
        tensors = [next_tensor(i) for i in bucket]
        start = time.perf_counter()
        if (
            len(bucket) == 1
            and not checksums
            and tensors[0].is_contiguous()
            and tensors[0].device == group.device
        ):
            buf = _as_bytes(tensors[0])  # in_flight keeps it alive until its broadcast is done
            stats["direct_bytes"] += size
        else:
            # The buffer's last user was packed STAGING packed buckets ago; at most IN_FLIGHT
            # (< STAGING) broadcasts are pending now, so its broadcast is done.
            buf = group.staging_buffers(size)[packed_count % STAGING][:size]
            packed_count += 1
            for tensor, off in zip(tensors, offsets, strict=True):
                buf[off : off + tensor.nbytes].copy_(_as_bytes(tensor.contiguous()))
            if checksums:
                _seal(buf)
        stats["pack_s"] += time.perf_counter() - start
        if len(in_flight) == IN_FLIGHT:
            finish(in_flight.popleft())
        in_flight.append((b, buf, group.broadcast_async(buf)))
    while in_flight:
        finish(in_flight.popleft())
    leftover = next(it, None)
    assert leftover is None, f"iter_full_weights yielded {leftover[0]} beyond the announced specs"
    return stats
