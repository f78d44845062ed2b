"""rlcore's methods inside each vLLM worker process (vLLM's `worker_extension_cls`).

vLLM mixes this class into its Worker; `LLM.collective_rpc("rlcore_...")` runs a method on every
worker (one per tensor-parallel rank). Each worker joins the weight-sync group itself, receives
every bucket straight into its own device memory and loads the full tensors through vLLM's
checkpoint-format reload, which shards them for its rank. Nothing but torch and rlcore.core is
imported here: this module is loaded inside vLLM's processes.
"""

from __future__ import annotations

import time
from typing import Any, cast

from ...weights.wire import (
    SyncGroup,
    TensorSpec,
    WeightCorruption,
    init_group,
    plan_buckets,
    receive_weights,
)
from .base import iter_safetensors


class RLCoreWorkerExtension:
    """Mixed into vLLM's Worker: `self` is the worker (rank, device, model_runner, reload_weights)."""

    # Attribute names must not clash with the Worker's: vLLM refuses an extension that shadows it.
    _rlcore_group: SyncGroup | None = None

    def rlcore_join(
        self, master_address: str, master_port: int, world_size: int, first_rank: int, backend: str,
        timeout_s: float, group_name: str,
    ) -> int:  # fmt: skip
        """Join the weight-sync group at rank first_rank + this worker's rank; returns that rank."""
        self._rlcore_group = None
        rank = first_rank + cast(Any, self).rank
        self._rlcore_group = init_group(
            master_address, master_port, world_size, rank, backend, timeout_s, group_name
        )
        return rank

    def rlcore_receive(
        self, specs: list[tuple[str, str, tuple[int, ...]]], bucket_bytes: int, version: int, checksums: bool
    ) -> dict[str, Any]:
        """Receive one version's buckets and load them. A checksum failure loads nothing and is
        returned (not raised) so that the engine can re-raise it with its details."""
        assert self._rlcore_group is not None, "rlcore_join first"
        tensor_specs = [TensorSpec(name, dtype, tuple(shape)) for name, dtype, shape in specs]
        stats: dict[str, float] = {}
        device = str(
            self._rlcore_group.device if self._rlcore_group.backend == "nccl" else cast(Any, self).device
        )
        weights = receive_weights(
            self._rlcore_group,
            tensor_specs,
            bucket_bytes,
            device,
            stats,
            checksums=checksums,
            version=version,
        )
        start = time.perf_counter()
        try:
            if checksums:  # every bucket is checked before vLLM's reload starts touching the model
                weights = iter(list(weights))
            cast(Any, self).reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        except WeightCorruption as e:
            return {
                "stats": stats,
                "bad": e.bad,
                "num_buckets": len(plan_buckets(tensor_specs, bucket_bytes)),
            }
        stats["load_s"] = time.perf_counter() - start - stats.get("receive_s", 0.0)
        return {"stats": stats, "bad": [], "num_buckets": 0}

    def rlcore_load_weights(self, weights: Any) -> None:
        """Load (name, tensor) pairs handed over in process (the engine runs in the caller's process)."""
        cast(Any, self).reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

    def rlcore_load_checkpoint(self, path: str) -> None:
        """Reload from an HF folder on disk (synchronizer.sync_method checkpoint)."""
        cast(Any, self).reload_weights(weights_iterator=iter_safetensors(path), is_checkpoint_format=True)
