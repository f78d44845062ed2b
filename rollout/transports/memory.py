"""sync_method memory: the engine runs in this trainer rank's process; weights are copied in memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.weight_sync import spec_of
from .base import WeightSource, WeightTransport, drain

if TYPE_CHECKING:
    from ..local import LocalRollout


class MemoryTransport(WeightTransport):
    def __init__(self, engine: LocalRollout | None):
        """`engine`: this rank's in-process engine, or None on a rank without one."""
        self.engine = engine
        if engine is not None:
            self.served = engine.engine.policy_version

    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        weights = source.iter_full_weights()
        if self.engine is None:
            drain(weights)
            return {}
        specs = [spec_of(*s) for s in source.weight_specs()]
        return self.engine.load_weights(specs, weights, self.announce(step))
