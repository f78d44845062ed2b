"""sync_method nccl: trainer rank 0 broadcasts the weights to the rollout workers over a process group
of their own (NCCL on GPU, gloo on CPU); names, dtypes and shapes travel over gRPC. A worker's half
receives the announced buckets into its engine (`receiver_half`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.rpc.errors import FailedPrecondition, require
from .base import PendingUpdate, WeightSink, WeightSource, WeightTransport, announce, drain
from .wire import plan_buckets, spec_of, specs_from_proto


class GroupTransport(WeightTransport):
    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        weights = source.iter_full_weights()
        sender = self.endpoints.sender
        try:
            if sender is None:
                return {}
            self.version = announce(step, sender.served())
            specs = [spec_of(*s) for s in source.weight_specs()]
            return sender.send(specs, weights, self.version)
        finally:
            drain(weights)  # the other ranks walk to the end whatever happened here

    @staticmethod
    def receiver_half(
        sink: WeightSink, request: Any, update: PendingUpdate, joined: bool
    ) -> tuple[int, Callable[[], None]]:
        if not joined:
            raise FailedPrecondition("no weight-sync group: call InitWeightSync first")
        specs = specs_from_proto(request.tensors, "tensors")
        bucket_bytes = request.bucket_bytes
        require(bucket_bytes > 0, "bucket_bytes", f"must be > 0; got {bucket_bytes}")

        def receive() -> None:
            update.phase = "receiving"
            start = time.perf_counter()
            sink.receive_weights(
                specs, bucket_bytes, update.version, checksums=request.checksums, stats=update.stats,
                on_phase=update.set_phase,
            )  # fmt: skip
            update.load_s = time.perf_counter() - start - update.stats.get("receive_s", 0.0)

        return len(plan_buckets(specs, bucket_bytes)), receive
