"""Rollout workers over gRPC (`rlcore rollout serve`, started by the launch or listed in
explorer.rollout_model.endpoints): a batch is split across them; weights reach them through a
transport (transports/group.py or transports/checkpoint.py)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from ..client.base import ClientOptions
from ..client.rollout import RolloutClient
from ..core.config.schema import RLCoreConfig
from ..core.step_metrics import rollout_report
from ..core.types import Experience, SamplingParams, Task, WorkflowSpec

log = logging.getLogger("rlcore.explorer")


class RemoteRollout:
    def __init__(self, cfg: RLCoreConfig, endpoints: list[str]):
        options = ClientOptions.from_control(cfg.control, timeout=cfg.explorer.max_timeout)
        self.clients = [RolloutClient(address, options) for address in endpoints]
        for address, info in zip(endpoints, [c.get_info() for c in self.clients], strict=True):
            if info.max_model_len < cfg.model.max_model_len:
                raise ValueError(
                    f"rollout worker {address} serves max_model_len {info.max_model_len} but "
                    f"model.max_model_len is {cfg.model.max_model_len}: start it with --max-model-len "
                    f"{cfg.model.max_model_len}"
                )
        self._pool = ThreadPoolExecutor(max_workers=len(self.clients))
        log.info("exploring on %d rollout worker(s): %s", len(endpoints), ", ".join(endpoints))

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]:
        n = len(self.clients)
        bounds = [len(tasks) * i // n for i in range(n + 1)]  # contiguous, balanced shares

        def share(i: int) -> list[list[Experience]]:
            chunk = tasks[bounds[i] : bounds[i + 1]]
            out: list[list[Experience]] = [[] for _ in chunk]
            if not chunk:
                return out
            seeded = (
                sampling
                if sampling.seed is None
                else SamplingParams(**{**asdict(sampling), "seed": sampling.seed + 7919 * i})
            )
            for index, exps in self.clients[i].run_tasks(chunk, seeded, spec, timeout=timeout):
                out[index] = exps
            return out

        return [e for part in self._pool.map(share, range(n)) for exps in part for e in exps]

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
