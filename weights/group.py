"""sync_method nccl: trainer rank 0 broadcasts the weights to the rollout workers over a process group
of their own (NCCL on GPU, gloo on CPU); names, dtypes and shapes travel over gRPC."""

from __future__ import annotations

from .base import WeightSource, WeightTransport, announce, drain
from .wire import spec_of


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
