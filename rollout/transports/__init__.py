"""Weight transports behind the WeightTransport interface (transports/base.py), and the one place
that picks one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.registry import Registry

if TYPE_CHECKING:
    from ..local import LocalRollout
    from ..weight_sender import WeightSender
    from .base import WeightTransport

TRANSPORTS = Registry(
    "synchronizer.sync_method",
    {
        "nccl": "rlcore.rollout.transports.group:GroupTransport",
        "checkpoint": "rlcore.rollout.transports.checkpoint:CheckpointTransport",
        "memory": "rlcore.rollout.transports.memory:MemoryTransport",
    },
)


def transport_name(sync_method: str, engines_in_process: bool) -> str:
    """The transport a stage uses: an engine in the trainer's process is reached by an in-memory
    copy whatever the method says (validation refuses the contradictions); rollout workers by
    their group (nccl, auto) or an HF folder (checkpoint)."""
    if engines_in_process:
        return "memory"
    return "checkpoint" if sync_method == "checkpoint" else "nccl"


def build_transport(
    sync_method: str, *, engine: LocalRollout | None, sender: WeightSender | None, workers: bool,
    folder: str, tokenizer_dir: str,
) -> WeightTransport:  # fmt: skip
    """This rank's transport for a stage: `workers` (rollout workers, reached by `sender` on rank 0)
    or this rank's in-process `engine` (None on a rank without one). `folder` and `tokenizer_dir`
    serve the checkpoint transport's exports."""
    name = transport_name(sync_method, engines_in_process=not workers)
    cls = TRANSPORTS.resolve(name)
    if name == "memory":
        return cls(engine)  # type: ignore[no-any-return]
    if name == "checkpoint":
        return cls(sender, folder, tokenizer_dir)  # type: ignore[no-any-return]
    return cls(sender)  # type: ignore[no-any-return]
