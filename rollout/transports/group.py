"""sync_method nccl: trainer rank 0 broadcasts the weights to the rollout workers over a process group
of their own (NCCL on GPU, gloo on CPU); names, dtypes and shapes travel over gRPC."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.weight_sync import spec_of
from .base import WeightSource, WeightTransport, drain

if TYPE_CHECKING:
    from ..weight_sender import WeightSender


class GroupTransport(WeightTransport):
    def __init__(self, sender: WeightSender | None):
        """`sender`: trainer rank 0's link to the workers; None on the other ranks."""
        self.sender = sender
        if sender is not None:
            self.served = max(c.get_info().policy_version for c in sender.clients)

    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        weights = source.iter_full_weights()
        try:
            if self.sender is None:
                return {}
            specs = [spec_of(*s) for s in source.weight_specs()]
            return self.sender.send(specs, weights, self.announce(step))
        finally:
            drain(weights)  # the other ranks walk to the end whatever happened here

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
