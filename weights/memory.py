"""sync_method memory: the engine runs in this trainer rank's process; weights are copied in memory."""

from __future__ import annotations

from .base import WeightSource, WeightTransport, announce, drain


class MemoryTransport(WeightTransport):
    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        weights = source.iter_full_weights()
        engine = self.endpoints.engine
        try:
            if engine is not None:
                self.version = announce(step, engine.policy_version)
                engine.load_weights(weights, self.version)
        finally:
            drain(weights)  # the other ranks walk to the end whatever happened here
        return {}
