"""Rollout workers over gRPC (`rlcore rollout serve`, started by the launch or listed in
explorer.rollout_model.endpoints): a batch is split across them; weights reach them through a
transport (transports/group.py or transports/checkpoint.py)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from ..client.base import ClientOptions, RpcError
from ..client.rollout import RolloutClient
from ..core.config.schema import RLCoreConfig
from ..core.step_metrics import rollout_report
from ..core.types import Experience, SamplingParams, Task, WorkflowSpec
from ..proto.v1 import rollout_pb2

log = logging.getLogger("rlcore.explorer")

GONE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")
"""Status codes of a worker that is not there (as opposed to one that answered with an error)."""
LOST = (*GONE, "UNAUTHENTICATED")
"""What a worker that served the run answers once it is gone: besides GONE, another server's refusal
of the run's token, which took the dead worker's port (seen when tests run side by side). At a
worker's joining, a refused token is the run's own error and fails it."""


LIVENESS_S = 10.0
"""Longest a worker that failed a call may take to answer GetInfo and so be found there."""


class NoWorkerAnswers(RuntimeError):
    """Every rollout worker of a batch stopped answering (the launch may be restarting them)."""


class WorkersPaused(RuntimeError):
    """Rollout workers refused a batch because they are paused, yet answer: a weight update holds
    them (one still running, or one whose sender died part way: they stay paused until the next
    version reaches them). They are kept; the batch is to be run again once they hold newer weights."""

    def __init__(self, addresses: list[str], version: int):
        self.addresses, self.version = addresses, version
        super().__init__(
            f"rollout worker(s) {', '.join(addresses)} are paused by a weight update (serving policy version "
            f"{version})"
        )


class RemoteRollout:
    bounded = True  # every call has an RPC deadline: a stalled worker fails over instead of ending the run

    def __init__(self, cfg: RLCoreConfig, endpoints: list[str], skip_unreachable: bool = False):
        """`skip_unreachable`: leave out (in `lost`) the workers that do not answer, instead of failing."""
        options = ClientOptions.from_control(cfg.control, timeout=cfg.explorer.max_timeout)
        self.clients: list[RolloutClient] = []
        self.lost: list[str] = []
        """Addresses of workers that stopped answering, in the order they did."""
        for address in endpoints:
            client = RolloutClient(address, options)
            try:
                info = client.get_info(timeout=min(30.0, cfg.explorer.max_timeout))
            except RpcError as e:
                client.close()
                if not skip_unreachable or e.code.name not in GONE:
                    raise
                log.warning("%s; left out", e)
                self.lost.append(address)
                continue
            if info.max_model_len < cfg.model.max_model_len:
                raise ValueError(
                    f"rollout worker {address} serves max_model_len {info.max_model_len} but "
                    f"model.max_model_len is {cfg.model.max_model_len}: start it with --max-model-len "
                    f"{cfg.model.max_model_len}"
                )
            self.clients.append(client)
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.clients)))
        self._lock = threading.Lock()
        log.info(
            "exploring on %d rollout worker(s): %s",
            len(self.clients),
            ", ".join(c.address for c in self.clients),
        )

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]:
        """Contiguous, balanced shares, one per worker. Engines seed each prompt by itself, so the
        batch samples what one worker would; a worker that stops answering is dropped (`lost`)
        and its share runs on a worker still answering: the batch comes out as if nothing had
        happened. Workers that answer but are paused (a weight update holds them) raise
        WorkersPaused once the others finished, and stay."""
        n = len(self.clients)
        if n == 0:
            raise NoWorkerAnswers(
                f"no rollout worker answers: {', '.join(self.lost) or 'none was given'} stopped"
            )
        bounds = [len(tasks) * i // n for i in range(n + 1)]
        shares: list[list[list[Experience]] | None] = [None] * n

        def share(i: int, client: RolloutClient) -> None:
            chunk = tasks[bounds[i] : bounds[i + 1]]
            out: list[list[Experience]] = [[] for _ in chunk]
            if chunk:
                for index, exps in client.run_tasks(chunk, sampling, spec, timeout=timeout):
                    out[index] = exps
            shares[i] = out

        todo = [(i, self.clients[i]) for i in range(n)]
        while todo:
            failed, paused = [], {}
            for (i, client), future in [(t, self._pool.submit(share, *t)) for t in todo]:
                try:
                    future.result()
                except RpcError as e:
                    if e.code.name not in LOST:
                        raise  # the worker answered: bad input, a failing reward
                    # refused while paused (UNAVAILABLE), or cut while it waited for a weight update to end
                    info = liveness(client) if e.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED") else None
                    if info is not None and info.paused:
                        paused[client.address] = info.policy_version
                        continue
                    self.drop(client, e)
                    failed.append(i)
            if paused:
                raise WorkersPaused(sorted(paused), min(paused.values()))
            if failed and not self.clients:
                raise NoWorkerAnswers(f"no rollout worker answers: {', '.join(self.lost)} stopped")
            todo = [(i, self.clients[k % len(self.clients)]) for k, i in enumerate(failed)]
        return [e for part in shares if part is not None for exps in part for e in exps]

    def drop(self, client: RolloutClient, error: RpcError) -> None:
        """Leave out a worker that stopped answering (its tasks go to the others)."""
        if self._leave_out(client):
            log.warning("%s; its tasks go to the other rollout workers", error)

    def forget(self, addresses: list[str]) -> None:
        """Leave out these workers (the launch removed them: they died), as `drop` does on a call."""
        for c in [c for c in self.clients if c.address in addresses]:
            if self._leave_out(c):
                c.close()

    def _leave_out(self, client: RolloutClient) -> bool:
        """Move a worker from `clients` to `lost`; False when it was gone already."""
        with self._lock:
            if client not in self.clients:
                return False
            self.clients.remove(client)
            self.lost.append(client.address)
            return True

    def adopt(self, other: RemoteRollout) -> None:
        """Take `other`'s workers (ready to serve: their weights loaded) into the batches from now on."""
        other._pool.shutdown(wait=False)
        with self._lock:
            self.clients.extend(other.clients)
            old, self._pool = self._pool, ThreadPoolExecutor(max_workers=max(1, len(self.clients)))
        old.shutdown(wait=False)
        log.info(
            "exploring on %d rollout worker(s): %s",
            len(self.clients),
            ", ".join(c.address for c in self.clients),
        )

    def report(self) -> dict[str, float]:
        return rollout_report(1, [])  # the workers report no engine/reward split

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        """Greedy decode of `prompt` on every worker: (address, tokens, log-probs) each."""
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        out = []
        for c in self.clients:
            (completion,) = c.generate([prompt], sampling).completions[0]
            out.append((c.address, completion.token_ids, completion.logprobs))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for c in self.clients:
            c.close()


def liveness(client: RolloutClient) -> rollout_pb2.GetInfoResponse | None:
    """The worker's GetInfo, or None when it does not answer (it is gone)."""
    try:
        return client.get_info(timeout=LIVENESS_S)
    except RpcError:
        return None
