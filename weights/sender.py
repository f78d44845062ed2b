"""Trainer rank 0's side of weight sync to rollout workers: the gRPC calls around the bytes
(wire.py).

    InitWeightSync (once)  ->  BeginWeightUpdate  ->  send_weights over the group  ->  FinishWeightUpdate

Each call goes to every worker at once; each phase has a deadline, and a missed one is a
WeightSyncError naming the worker and the phase.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .wire import SyncGroup, TensorSpec, WeightSyncError, init_group, plan_buckets, send_weights

if TYPE_CHECKING:
    from ..client.base import ClientOptions
    from ..client.rollout import RolloutClient
    from ..core.config.schema import SynchronizerConfig

log = logging.getLogger("rlcore.weights")


class WeightSender:
    """Trainer rank 0's side: forms the group with the workers once, then pushes versions.

    Worker i takes `ranks[i]` consecutive group ranks (one per engine process that receives, e.g.
    each tensor-parallel worker of a vLLM engine), after the ranks of the workers before it. Every
    phase has a deadline of `timeout_s`; a missed one is an error naming the worker and the phase.
    """

    def __init__(
        self,
        clients: list[RolloutClient],
        *,
        backend: str,
        timeout_s: float,
        bucket_bytes: int,
        master_address: str = "127.0.0.1",
        ranks: list[int] | None = None,
        checksums: bool = False,
        owns_clients: bool = False,
    ):
        """`owns_clients`: close the clients with the sender."""
        assert clients, "no rollout workers to sync"
        self.clients = clients
        self.backend, self.timeout_s, self.bucket_bytes = backend, timeout_s, bucket_bytes
        self.master_address = master_address
        self.ranks = ranks or [1] * len(clients)
        assert len(self.ranks) == len(clients) and all(r >= 1 for r in self.ranks)
        self.checksums = checksums
        self.owns_clients = owns_clients
        self.group: SyncGroup | None = None
        self._pool = ThreadPoolExecutor(max_workers=len(clients))

    def _results(self, futures: list[Any], phase: str, what: str) -> list[Any]:
        """Each worker's answer, or an error naming the first worker that failed and the phase."""
        from ..client.base import RpcError

        out = []
        for c, f in zip(self.clients, futures, strict=True):
            try:
                out.append(f.result(timeout=self.timeout_s + 5))
            except (RpcError, TimeoutError) as e:
                late = isinstance(e, TimeoutError) or e.code.name == "DEADLINE_EXCEEDED"
                reason = (
                    f"did not answer within {self.timeout_s:g} s (synchronizer.sync_timeout)"
                    if late
                    else str(e)
                )
                raise WeightSyncError(
                    f"{what}: rollout worker {c.address} {reason} in phase {phase}: {e}"
                ) from e
        return out

    def _ensure_group(self) -> SyncGroup:
        if self.group is not None:
            return self.group
        world = sum(self.ranks) + 1
        firsts = [1 + sum(self.ranks[:i]) for i in range(len(self.clients))]
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(
            self.master_address, 0, world, is_master=True, timeout=timeout, wait_for_workers=False
        )
        name = f"{store.port}-{time.time_ns()}"
        joins = [
            self._pool.submit(
                c.init_weight_sync,
                self.master_address,
                store.port,
                world,
                first,
                self.backend,
                self.timeout_s,
                name,
                timeout=self.timeout_s,
            )  # fmt: skip
            for first, c in zip(firsts, self.clients, strict=True)
        ]
        try:
            group = init_group(
                self.master_address, store.port, world, 0, self.backend, self.timeout_s, name, store
            )
        except RuntimeError as e:
            failed = [
                c.address for c, f in zip(self.clients, joins, strict=True) if f.done() and f.exception()
            ]
            reasons = "; ".join(str(f.exception()) for f in joins if f.done() and f.exception())
            raise WeightSyncError(
                f"weight-sync group did not form within {self.timeout_s:g} s (synchronizer.sync_timeout) "
                f"in phase init; workers that failed to join: {', '.join(failed) or 'none reported'} "
                f"{reasons} ({e})"
            ) from e
        self._results(joins, "init", "forming the weight-sync group")
        for c in self.clients:
            log.info("weight-sync group formed with %s", c.address)
        self.group = group
        return group

    def send(
        self, specs: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> dict[str, float]:
        """Announce, broadcast and confirm one version on every worker; returns timings and bytes."""
        start = time.perf_counter()
        what = f"weight sync of version {policy_version}"
        group = self._ensure_group()
        expected = len(plan_buckets(specs, self.bucket_bytes))
        begins = [
            self._pool.submit(
                c.begin_weight_update,
                policy_version,
                specs,
                self.bucket_bytes,
                timeout=self.timeout_s,
                checksums=self.checksums,
            )  # fmt: skip
            for c in self.clients
        ]
        for c, got in zip(self.clients, self._results(begins, "begin", what), strict=True):
            assert got == expected, f"{c.address} plans {got} buckets, the sender {expected}"
        try:
            stats = send_weights(group, specs, weights, self.bucket_bytes, checksums=self.checksums)
        except RuntimeError as e:
            self.group = None  # the group is unusable after a failed collective; re-form next time
            raise WeightSyncError(
                f"{what} failed in phase send (synchronizer.sync_timeout {self.timeout_s:g} s): "
                f"{self._not_answering()}: {e}"
            ) from e
        stats.update(self._finish(policy_version, what))
        stats["total_s"] = time.perf_counter() - start
        return stats

    def _not_answering(self, probe_s: float = 10.0) -> str:
        """After a failed broadcast, which gloo does not pin on one peer: the workers that do not
        answer GetInfo within sync_timeout (at most `probe_s`): a cut link, a dead or stalled
        process. The subject of the send phase's error."""
        from ..client.base import RpcError

        timeout = min(self.timeout_s, probe_s)
        probes = [self._pool.submit(c.get_info, timeout=timeout) for c in self.clients]
        silent = []
        for c, probe in zip(self.clients, probes, strict=True):
            try:
                probe.result(timeout=timeout + 5)
            except (RpcError, TimeoutError):
                silent.append(c.address)
        if silent:
            return f"rollout worker {', '.join(silent)} does not answer (its link or process is down?)"
        return f"to {', '.join(c.address for c in self.clients)} (each answers GetInfo)"

    def send_checkpoint(self, path: str, policy_version: int) -> dict[str, float]:
        """Have every worker load the HF folder `path` as `policy_version` (sync_method checkpoint)."""
        start = time.perf_counter()
        what = f"checkpoint sync of version {policy_version} from {path}"
        begins = [
            self._pool.submit(
                c.begin_weight_update, policy_version, [], 0, timeout=self.timeout_s, checkpoint_path=path
            )
            for c in self.clients
        ]
        self._results(begins, "begin", what)
        stats = self._finish(policy_version, what)
        stats["total_s"] = time.perf_counter() - start
        return stats

    def _finish(self, policy_version: int, what: str) -> dict[str, float]:
        finishes = [
            self._pool.submit(c.finish_weight_update, policy_version, timeout=self.timeout_s)
            for c in self.clients
        ]
        load_s = 0.0
        for answer in self._results(finishes, "load", what):
            assert answer.policy_version == policy_version
            load_s = max(load_s, answer.load_s)
        return {"load_s": load_s}

    def served(self) -> int:
        """The newest version any of the workers serves now."""
        return max(c.get_info().policy_version for c in self.clients)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.group = None
        if self.owns_clients:
            for c in self.clients:
                c.close()


def connect(
    workers: list[str] | list[RolloutClient], sc: SynchronizerConfig, options: ClientOptions | None = None,
    device: str = "cpu", master_address: str = "127.0.0.1",
) -> WeightSender:  # fmt: skip
    """The one way to a sender to rollout workers, with the stage's synchronizer settings: every
    launch, serve and explore path takes it. `workers`: addresses (the sender opens clients with
    `options` and closes them with itself) or the caller's open clients. A group, when the
    transport forms one, is joined at `master_address` (an address of this host they can reach),
    over NCCL on CUDA and gloo elsewhere."""
    from ..client.rollout import RolloutClient

    owns = all(isinstance(w, str) for w in workers)
    clients = [RolloutClient(w, options) if isinstance(w, str) else w for w in workers]
    try:
        ranks = [max(1, c.get_info().weight_sync_ranks) for c in clients]
    except BaseException:
        if owns:
            for c in clients:
                c.close()
        raise
    return WeightSender(
        clients,
        backend="nccl" if device == "cuda" else "gloo",
        timeout_s=sc.sync_timeout,
        bucket_bytes=sc.bucket_mb << 20,
        master_address=master_address,
        ranks=ranks,
        checksums=sc.checksums,
        owns_clients=owns,
    )
