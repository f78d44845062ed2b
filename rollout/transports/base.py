"""The WeightTransport interface: how one version of the trainer's full weights reaches the engines.

Every trainer rank calls `push` with the same step (walking the weights is collective on sharded
strategies); only the ranks that hold an engine, or talk to rollout workers, deliver. Every
transport follows one policy-version rule (`announce`): the engines receive versions that only
grow, the stage's optimizer step when it is newer than what they serve, else one past it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Protocol

import torch


class WeightSource(Protocol):
    """What a transport reads from the trainer (a TrainingStrategy satisfies it)."""

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]: ...

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def hf_config(self) -> Any: ...


class WeightTransport(ABC):
    served: int = -1
    """The version the engines hold (-1: unknown, nothing announced yet)."""

    def announce(self, step: int) -> int:
        """The version to send for optimizer step `step`: the one policy-version rule."""
        self.served = max(step, self.served + 1)
        return self.served

    @abstractmethod
    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        """Deliver the current weights as the version for `step`; returns what was measured
        (`num_bytes`, `total_s` where the transport knows them)."""

    def close(self) -> None:
        """Release groups and connections."""
        return None


def drain(weights: Iterator[Any]) -> None:
    """Walk the rest of a weight iterator: ranks that deliver nothing still take part in the
    strategy's gathers."""
    for _ in weights:
        pass
