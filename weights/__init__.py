"""The weights wing: how the trainer's weights reach the engines.

    wire.py        the wire protocol: tensor specs, buckets, the process group, checksums
    schedule.py    when to sync, which experiences are too stale, the probe (versions: base.announce)
    base.py        the WeightTransport interface (push; receiver_half), the engine's WeightSink
    sender.py      trainer rank 0's link to the rollout workers (`connect`)
    receiver.py    a rollout worker's update state machine; it runs the transport's receiver_half
    group.py       nccl: buckets broadcast over a process group (NCCL on GPU, gloo on CPU)
    checkpoint.py  checkpoint: an HF folder the workers load
    memory.py      memory: an in-process copy into the trainer's own engine
    publish.py     publish: versioned folders an explore launch's workers load

The run plan picks a stage's transport (StagePlan.weights, "auto" resolved); adding one is a file
here and a line in TRANSPORTS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.registry import Registry

if TYPE_CHECKING:
    from .base import Endpoints, WeightTransport

TRANSPORTS = Registry(
    "synchronizer.sync_method",
    {
        "nccl": "rlcore.weights.group:GroupTransport",
        "checkpoint": "rlcore.weights.checkpoint:CheckpointTransport",
        "memory": "rlcore.weights.memory:MemoryTransport",
        "publish": "rlcore.weights.publish:PublishTransport",
    },
)


SYNC_METHODS = {"auto": "", **{name: path for name, path in TRANSPORTS.items() if name != "publish"}}
"""synchronizer.sync_method's choices: auto (the run plan picks) or a transport (publish is the
trainer's side of a decoupled run, not a method to choose)."""


def build_transport(name: str, endpoints: Endpoints) -> WeightTransport:
    """This rank's transport `name` (the run plan's StagePlan.weights, or publish) to `endpoints`."""
    cls = TRANSPORTS.resolve(name)
    return cls(endpoints)  # type: ignore[no-any-return]
