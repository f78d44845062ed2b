"""Weight transports behind the WeightTransport interface (transports/base.py), and the one place
that picks one for a stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.registry import Registry

if TYPE_CHECKING:
    from .base import Endpoints, WeightTransport

TRANSPORTS = Registry(
    "synchronizer.sync_method",
    {
        "nccl": "rlcore.rollout.transports.group:GroupTransport",
        "checkpoint": "rlcore.rollout.transports.checkpoint:CheckpointTransport",
        "memory": "rlcore.rollout.transports.memory:MemoryTransport",
        "publish": "rlcore.rollout.transports.publish:PublishTransport",
    },
)


def transport_name(sync_method: str, engines_in_process: bool) -> str:
    """An engine in the trainer's process is reached by an in-memory copy whatever the method says
    (validation refuses the contradictions); rollout workers by their group (nccl, auto) or an HF
    folder (checkpoint)."""
    if engines_in_process:
        return "memory"
    return "checkpoint" if sync_method == "checkpoint" else "nccl"


def build_transport(sync_method: str, workers: bool, endpoints: Endpoints) -> WeightTransport:
    """This rank's transport for a stage whose engines are rollout `workers` or in process."""
    cls = TRANSPORTS.resolve(transport_name(sync_method, engines_in_process=not workers))
    return cls(endpoints)  # type: ignore[no-any-return]
