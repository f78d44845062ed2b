"""The WeightTransport interface: how one version of the trainer's full weights reaches the engines.

Every trainer rank calls `push` with the same step (walking the weights is collective on sharded
strategies); only the rank that holds an engine, or talks to rollout workers, delivers, and a
delivering rank that fails still walks the weights with the others before it raises, so the ranks
stay in step. Every transport follows one policy-version rule (`announce`).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from .sender import WeightSender
    from .wire import TensorSpec


class WeightSource(Protocol):
    """What a transport reads from the trainer (a TrainingStrategy satisfies it)."""

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]: ...

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def hf_config(self) -> Any: ...


class WeightSink(Protocol):
    """An engine as weights reach it (a RolloutEngine satisfies it): the receiving half of every
    transport loads through these."""

    policy_version: int
    """The version of the weights it serves."""
    weight_sync_ranks: int
    """How many ranks it takes in a weight-sync group (vLLM: its tensor-parallel workers)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None: ...

    def join_weight_sync(
        self, master_address: str, master_port: int, world_size: int, first_rank: int, backend: str,
        timeout_s: float, group_name: str,
    ) -> None: ...  # fmt: skip

    def receive_weights(
        self, specs: list[TensorSpec], bucket_bytes: int, policy_version: int, *, checksums: bool,
        stats: dict[str, float], on_phase: Callable[[str], None] = ...,
    ) -> None: ...  # fmt: skip

    def load_checkpoint(self, path: str, policy_version: int) -> None: ...

    def resume(self) -> None: ...


class Gate(Protocol):
    """What holds generation back while weights load (rollout/gate.py's GenerationGate)."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def wait_idle(self, timeout: float | None = None) -> bool: ...


class InProcessEngine(Protocol):
    """An engine in the trainer's process, as transport memory loads it (rollout/local.py's
    LocalRollout: it wakes a sleeping engine around the load)."""

    @property
    def policy_version(self) -> int: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...


@dataclass
class Endpoints:
    """What this rank's transport reaches for a stage."""

    engine: InProcessEngine | None = None
    """This rank's in-process engine (transport memory)."""
    sender: WeightSender | None = None
    """Trainer rank 0's link to the rollout workers (transports nccl and checkpoint); None elsewhere."""
    folder: str = ""
    """Where the checkpoint transport writes its `version_N` folders."""
    tokenizer_dir: str = ""
    """The model folder whose tokenizer files go with each export."""


def announce(step: int, served: int) -> int:
    """The one policy-version rule: engines accept only growing versions, so the version sent for
    optimizer step `step` is the step when it is newer than what they serve, else one past it."""
    return max(step, served + 1)


@dataclass
class PendingUpdate:
    """A worker's weight update between BeginWeightUpdate and FinishWeightUpdate (receiver.py)."""

    version: int
    thread: threading.Thread | None = None
    phase: str = "waiting for running generation to finish"
    stats: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0
    error: BaseException | None = None

    def set_phase(self, phase: str) -> None:
        self.phase = phase


class WeightTransport(ABC):
    """A transport's two halves: `push` on the trainer ranks, and (for one that reaches rollout
    workers) `receiver_half` on a worker, which receiver.py runs for the BeginWeightUpdate requests
    the transport sends."""

    def __init__(self, endpoints: Endpoints):
        self.endpoints = endpoints
        self.version = -1
        """The version the last push announced."""

    @abstractmethod
    def push(self, source: WeightSource, step: int) -> dict[str, float]:
        """Deliver the current weights as the version for `step`; returns what was measured
        (`num_bytes`, `total_s` where the transport knows them)."""

    def close(self) -> None:
        if self.endpoints.sender is not None:
            self.endpoints.sender.close()

    @staticmethod
    def receiver_half(
        sink: WeightSink, request: Any, update: PendingUpdate, joined: bool
    ) -> tuple[int, Callable[[], None]]:
        """A worker's half: check a BeginWeightUpdate `request` (ValueError-like rpc errors name the
        field) and return (the buckets it announces, the work that receives and loads the version
        into `sink`; receiver.py runs it on the update's thread, under the engine lock). `joined`:
        whether the worker is in a weight-sync group (InitWeightSync)."""
        raise NotImplementedError("this transport reaches no rollout worker")


def drain(weights: Iterator[Any]) -> None:
    """Walk the rest of a weight iterator: ranks that deliver nothing still take part in the
    strategy's gathers."""
    for _ in weights:
        pass
