"""What the gRPC control plane costs a rollout: `Generate` through a `rlcore rollout serve` worker
against `HFEngine.generate` called in this process, on the same model, prompts and seeded sampling.

The two sides never run at once (one is idle while the other is measured) and alternate repeat by
repeat, because these machines drift by tens of percent over minutes: the ratio of a pair of
neighbouring runs is what this reports, with min/median/max over the pairs. Both sides use the same
CPU thread count. Target (issue 3): the gRPC path keeps >= 95% of in-process tokens/s.

    python benchmarks/grpc_overhead.py --prompts 64 --max-tokens 32 --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlcore.benchmarks.common import count_tokens, default_out, spread

if TYPE_CHECKING:
    from rlcore.core.types import Completion

TOKEN_ENV = "RLCORE_BENCH_TOKEN"
MAX_MODEL_LEN = 1024
SERVER_START_TIMEOUT_S = 180.0


def make_prompts(tokenizer: Any, num: int, seed: int) -> list[list[int]]:
    """Arithmetic questions of varied length (the batch is left-padded, as in a real rollout)."""
    rng = random.Random(seed)
    texts = [f"{rng.randint(0, 10 ** rng.randint(1, 6))}+{rng.randint(0, 999)}=" for _ in range(num)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def start_server(model: str, threads: int, token: str, workdir: str) -> tuple[subprocess.Popen, str]:
    """A `rlcore rollout serve` subprocess; answers it and the host:port it serves on."""
    port_file = os.path.join(workdir, "rollout.port")
    cmd = [
        sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", model, "--engine", "hf",
        "--device", "cpu", "--dtype", "float32", "--threads", str(threads), "--max-model-len",
        str(MAX_MODEL_LEN), "--port", "0", "--port-file", port_file, "--token-env", TOKEN_ENV,
    ]  # fmt: skip
    log_path = os.path.join(workdir, "rollout.log")
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            cmd, env={**os.environ, TOKEN_ENV: token}, stdout=log, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            with open(log_path) as f:
                raise RuntimeError(f"rollout server exited with code {proc.returncode}:\n{f.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"rollout server did not write {port_file} in {SERVER_START_TIMEOUT_S:g} s")
        time.sleep(0.1)
    with open(port_file) as f:
        return proc, f.read().strip()


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def timed(fn: Callable[[], list[list[Completion]]]) -> tuple[float, list[list[Completion]]]:
    start = time.perf_counter()
    results = fn()
    return time.perf_counter() - start, results


def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    import torch  # here, not at the top: `rlcore bench grpc --help` imports no torch

    from rlcore.client.base import ClientOptions
    from rlcore.client.rollout import RolloutClient
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model
    from rlcore.core.types import SamplingParams
    from rlcore.rollout.engines.hf import HFEngine

    torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        model = os.path.join(workdir, "scratch")
        build_scratch_model(model, ScratchModelConfig(enabled=True), max_model_len=MAX_MODEL_LEN, seed=0)

    token = secrets.token_hex(16)
    proc, address = start_server(model, args.threads, token, workdir)
    try:
        engine = HFEngine(model, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN)
        client = RolloutClient(address, ClientOptions(token=token, timeout=600.0))
        prompts = make_prompts(engine.tokenizer, args.prompts, seed=0)
        sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=1234)
        sides: dict[str, Callable[[], list[list[Completion]]]] = {
            "in_process": lambda: engine.generate(prompts, sampling),
            "grpc": lambda: client.generate(prompts, sampling).completions,
        }
        for fn in sides.values():  # warm-up: first-call allocations, connection set-up
            fn()

        tokens_per_s: dict[str, list[float]] = {name: [] for name in sides}
        tokens: dict[str, list[int]] = {name: [] for name in sides}
        same_tokens = True
        for _ in range(args.repeats):
            outputs = {}
            for name, fn in sides.items():  # A B A B ...: the pair shares the machine's current speed
                seconds, outputs[name] = timed(fn)
                tokens[name].append(count_tokens(outputs[name]))
                tokens_per_s[name].append(tokens[name][-1] / seconds)
            same_tokens &= [c.token_ids for s in outputs["grpc"] for c in s] == [
                c.token_ids for s in outputs["in_process"] for c in s
            ]
        ratios = [g / p for g, p in zip(tokens_per_s["grpc"], tokens_per_s["in_process"], strict=True)]

        # Pure call overhead: one prompt, one token.
        tiny = SamplingParams(temperature=1.0, max_tokens=1, seed=1234)
        one = prompts[:1]
        tiny_sides: dict[str, Callable[[], list[list[Completion]]]] = {
            "in_process": lambda: engine.generate(one, tiny),
            "grpc": lambda: client.generate(one, tiny).completions,
        }
        latency_s: dict[str, list[float]] = {name: [] for name in tiny_sides}
        for _ in range(args.latency_calls):
            for name, fn in tiny_sides.items():
                latency_s[name].append(timed(fn)[0])
        client.close()
    finally:
        stop_server(proc)

    return {
        "benchmark": "grpc_overhead",
        "config": {
            "model": args.model or "scratch (ScratchModelConfig defaults, seed 0)",
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "threads": args.threads,
            "latency_calls": args.latency_calls,
            "sampling": {"temperature": sampling.temperature, "seed": sampling.seed},
        },
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "loadavg_at_end": list(os.getloadavg()),
        },
        "tokens_per_s": {name: spread(v) for name, v in tokens_per_s.items()},
        "tokens_per_run": tokens,
        "same_tokens_both_sides": same_tokens,
        "ratio_grpc_over_in_process": spread(ratios),
        "target_ratio": 0.95,
        "call_latency_ms_1_prompt_1_token": {
            name: {"median": 1000 * statistics.median(v), "min": 1000 * min(v)}
            for name, v in latency_s.items()
        },
    }


def markdown(result: dict[str, Any]) -> str:
    tps, ratio = result["tokens_per_s"], result["ratio_grpc_over_in_process"]
    lat = result["call_latency_ms_1_prompt_1_token"]
    cfg = result["config"]
    rows = [
        f"`Generate` {cfg['prompts']} prompts x {cfg['max_tokens']} tokens, {cfg['threads']} thread(s), "
        f"{cfg['repeats']} alternating repeats",
        "",
        "| side | min tok/s | median tok/s | max tok/s | call latency (1 prompt, 1 token), median |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("in_process", "grpc"):
        s = tps[name]
        rows.append(
            f"| {name} | {s['min']:.0f} | {s['median']:.0f} | {s['max']:.0f} | {lat[name]['median']:.2f} ms |"
        )
    rows.append(
        f"| **grpc / in_process** | {ratio['min']:.3f} | {ratio['median']:.3f} | {ratio['max']:.3f} | "
        f"{lat['grpc']['median'] - lat['in_process']['median']:+.2f} ms |"
    )
    rows.append("")
    verdict = "meets" if ratio["median"] >= result["target_ratio"] else "MISSES"
    rows.append(
        f"median ratio {ratio['median']:.3f} {verdict} the target {result['target_ratio']}; "
        f"same tokens on both sides: {result['same_tokens_both_sides']}"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", help="HF model folder (default: build the scratch model in a temp folder)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per response (at most)")
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats of each side")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each side's engine")
    parser.add_argument("--latency-calls", type=int, default=20, help="1-prompt 1-token calls per side")
    parser.add_argument("--out", default=default_out("grpc_overhead.json"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    for name in ("prompts", "max_tokens", "repeats", "threads", "latency_calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")

    with tempfile.TemporaryDirectory(prefix="rlcore-grpc-bench-") as workdir:
        result = run(args, workdir)
    print(markdown(result))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
