"""Concurrent requests to the OpenAI-compatible door against one request for as many completions.

Agents call the door one request at a time, many at once. The rollout worker merges concurrent
requests with the same sampling into shared engine calls (rollout/batching.py, as it merges the
explorer's tasks), so `--concurrency` single requests should cost about what one request with
n=`--concurrency` costs. Three sides, through a real `rlcore rollout serve --http-port` worker and
the `openai` package:

- `n`: one request, n=C completions of one prompt;
- `concurrent`: C requests of n=1 at once (C different prompts of the same length), from C threads;
- `mixed`: C requests at once as agents send them: each with its own seed and max_tokens (from
  `--max-tokens` down to half of it), which the worker's running batch takes together (the HF
  engine's continuous batching: engines/hf_running.py);
- `sequential`: the same C requests one after another: what the door cost before it batched
  (each request held the engine by itself).

Two latencies beside them, in the same repeats: a streamed `--stream-tokens`-token answer's time to
its first text against its whole time (`stream`), and a 4-token request sent 0.2 s into such a
long one against the same request alone (`short_in_long`).

Each repeat runs the sides one after another, in alternating order (these machines drift); the
report gives each side's wall time and tokens/s, and the ratio to `n` within each repeat
(min/median/max). Tokens differ a little between sides (a completion may stop early on EOS):
compare tokens/s.

    rlcore bench door --concurrency 8 --max-tokens 48 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlcore.benchmarks.cli_args import missing_packages, positive_int
from rlcore.benchmarks.common import (
    default_out,
    machine_info,
    machine_line,
    pyplot,
    run_sides,
    save_figure,
    spread,
    start_server,
    versions,
    write_outputs,
)
from rlcore.core.rpc.cli import await_port_file

SIDES = ("n", "concurrent", "mixed", "sequential", "stream", "short_in_long")
SHORT_TOKENS = 4
SHORT_AFTER_S = 0.2
TOKEN_ENV = "RLCORE_BENCH_TOKEN"
MAX_MODEL_LEN = 512
START_TIMEOUT_S = 180.0


def prompts(count: int) -> list[str]:
    """`count` different arithmetic prompts of one length (so every side generates from prompts
    the same size)."""
    return [f"{100 + i:03d}+{(7 * i) % 1000:03d}=" for i in range(count)]


def serve(args: argparse.Namespace, model: str, token: str, workdir: str) -> tuple[subprocess.Popen, str]:
    """A rollout worker serving the door; the process and the door's base URL."""
    http_file = os.path.join(workdir, "http.port")
    argv = ["rollout", "serve", "--model", model, "--engine", "hf", "--device", args.device, "--dtype", args.dtype,
            "--threads", str(args.threads), "--max-model-len", str(MAX_MODEL_LEN), "--token-env", TOKEN_ENV,
            "--served-model-name", "bench", "--http-port", "0", "--http-port-file", http_file,
            "--http-batch-wait-ms", str(args.batch_wait_ms)]  # fmt: skip
    proc, _ = start_server(
        argv, workdir, "worker", set(os.sched_getaffinity(0)), {TOKEN_ENV: token}, START_TIMEOUT_S
    )
    return (
        proc,
        f"http://{await_port_file(http_file, proc, 30, f'the HTTP door (log: {workdir}/worker.log)')}/v1",
    )


def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    import openai

    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    model = args.model_dir
    if model is None:
        model = os.path.join(workdir, "scratch")
        build_scratch_model(model, ScratchModelConfig(enabled=True), max_model_len=MAX_MODEL_LEN, seed=0)
    token = secrets.token_hex(16)
    proc, base = serve(args, model, token, workdir)
    api = openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=600)
    texts = prompts(args.concurrency)
    pool = ThreadPoolExecutor(args.concurrency)

    def one(prompt: str, n: int, seed: int) -> int:
        answer = api.completions.create(
            model="bench", prompt=prompt, max_tokens=args.max_tokens, n=n, temperature=1.0, seed=seed
        )
        assert answer.usage is not None  # the door always reports usage
        return answer.usage.completion_tokens

    def own(i: int, rep: int) -> int:
        """Request i of the mixed side: its own seed and length."""
        answer = api.completions.create(
            model="bench", prompt=texts[i], max_tokens=args.max_tokens - i * args.max_tokens // (2 * len(texts)),
            temperature=1.0, seed=1000 * rep + i,
        )  # fmt: skip
        assert answer.usage is not None
        return answer.usage.completion_tokens

    def long(rep: int, seen: list[float] | None = None) -> int:
        """A streamed answer of --stream-tokens tokens; `seen` gets when its first text came."""
        start, tokens = time.perf_counter(), 0
        stream = api.completions.create(
            model="bench", prompt=texts[0], max_tokens=args.stream_tokens, temperature=1.0, seed=rep, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        for chunk in stream:
            if seen is not None and not seen and any(c.text for c in chunk.choices):
                seen.append(time.perf_counter() - start)
            for c in chunk.choices:
                tokens += len((c.model_extra or {}).get("token_ids") or [])
        return tokens

    def short(rep: int) -> float:
        start = time.perf_counter()
        api.completions.create(model="bench", prompt=texts[-1], max_tokens=SHORT_TOKENS, temperature=1.0,
                               seed=rep, extra_body={"ignore_eos": True})  # fmt: skip
        return time.perf_counter() - start

    def side(name: str, rep: int) -> dict[str, Any]:
        start, extra = time.perf_counter(), {}
        if name == "n":
            tokens = one(texts[0], args.concurrency, rep)
        elif name == "concurrent":
            tokens = sum(pool.map(lambda p: one(p, 1, rep), texts))
        elif name == "mixed":
            tokens = sum(pool.map(lambda i: own(i, rep), range(len(texts))))
        elif name == "sequential":
            tokens = sum(one(p, 1, rep) for p in texts)
        elif name == "stream":
            first: list[float] = []
            tokens = long(rep, first)
            extra = {"first_text_s": first[0], "first_over_total": first[0] / (time.perf_counter() - start)}
        else:  # short_in_long
            alone = short(rep)
            start = time.perf_counter()
            running = pool.submit(long, rep)
            time.sleep(SHORT_AFTER_S)
            beside = short(rep)
            tokens = running.result() + SHORT_TOKENS
            extra = {"short_alone_s": alone, "short_beside_s": beside, "beside_over_alone": beside / alone}
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, **extra}

    try:
        for name in SIDES:  # warm-up: first-call allocations, the connection
            side(name, -1)
        runs = run_sides(
            SIDES, args.repeats, side, lambda r: f"{r['seconds']:.3f} s, {r['tokens']} tokens", width=10
        )
    finally:
        pool.shutdown()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    ratios = {
        f"{s}_over_n": {
            "seconds": spread([a["seconds"] / b["seconds"] for a, b in zip(runs[s], runs["n"], strict=True)]),
            "tokens_per_s": spread(
                [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[s], runs["n"], strict=True)]
            ),
        }
        for s in ("concurrent", "mixed", "sequential")
    }
    ratios["stream_first_text_over_total"] = spread([r["first_over_total"] for r in runs["stream"]])
    ratios["short_beside_long_over_alone"] = spread([r["beside_over_alone"] for r in runs["short_in_long"]])
    return {
        "benchmark": "door_concurrency",
        "config": {k: getattr(args, k) for k in ("concurrency", "max_tokens", "stream_tokens", "repeats", "threads",
                                                 "device", "dtype", "batch_wait_ms")} | {"model": args.model_dir or "scratch"},
        "machine": machine_info(),
        "versions": versions(),
        "sides": {s: {"seconds": spread([r["seconds"] for r in runs[s]]),
                      "tokens": [r["tokens"] for r in runs[s]],
                      "tokens_per_s": spread([r["tokens_per_s"] for r in runs[s]])} for s in SIDES},
        "ratios": ratios,
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    cfg, sides, ratios = result["config"], result["sides"], result["ratios"]
    c = cfg["concurrency"]
    rows = [
        f"# The OpenAI door: {c} concurrent requests against one request with n={c}",
        "",
        f"{machine_line(result['machine'])}; HF engine ({cfg['dtype']}, {cfg['threads']} thread(s)), "
        f"{cfg['max_tokens']} tokens per completion, temperature 1, `--http-batch-wait-ms {cfg['batch_wait_ms']:g}`, "
        f"{cfg['repeats']} repeats in alternating order.",
        "",
        "| side | wall s (min / median / max) | tokens/s (median) | wall / `n` side (min / median / max) |",
        "|---|---:|---:|---:|",
    ]
    for s, label in (("n", f"1 request, n={c}"), ("concurrent", f"{c} concurrent requests, n=1"),
                     ("mixed", f"{c} concurrent requests, each its own seed and max_tokens"),
                     ("sequential", f"{c} requests one after another")):  # fmt: skip
        w = sides[s]["seconds"]
        ratio = ratios.get(f"{s}_over_n", {}).get("seconds")
        rel = f"{ratio['min']:.2f} / {ratio['median']:.2f} / {ratio['max']:.2f}" if ratio else "1"
        rows.append(
            f"| {label} | {w['min']:.3f} / {w['median']:.3f} / {w['max']:.3f} | "
            f"{sides[s]['tokens_per_s']['median']:.0f} | {rel} |"
        )
    tps = ratios["concurrent_over_n"]["tokens_per_s"]["median"]
    mixed = ratios["mixed_over_n"]["seconds"]
    first, short = ratios["stream_first_text_over_total"], ratios["short_beside_long_over_alone"]
    rows += [
        "",
        f"Concurrent requests reach {tps:.2f}x the tokens/s of one n={c} request (median of the pairs); "
        f"{c} requests each with its own seed and max_tokens take {mixed['median']:.2f}x its wall time "
        f"({mixed['min']:.2f} / {mixed['max']:.2f}).",
        "",
        f"A streamed {cfg['stream_tokens']}-token answer's first text came at {first['median']:.3f} of its "
        f"whole time (min {first['min']:.3f}, max {first['max']:.3f}); a {SHORT_TOKENS}-token request sent "
        f"{SHORT_AFTER_S:g} s into it took {short['median']:.2f}x its time alone ({short['min']:.2f} / {short['max']:.2f}).",
    ]
    return "\n".join(rows)


def plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    sides = result["sides"]
    shown = ("n", "concurrent", "mixed", "sequential")
    ax.bar(list(shown), [sides[s]["seconds"]["median"] for s in shown], color=["#4c72b0", "#55a868", "#8172b2", "#c44e52"])
    ax.set_ylabel("wall seconds (median)")
    ax.set_title(f"door: {result['config']['concurrency']} completions, four ways")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--model-dir", help="HF model folder (default: the scratch model, built in a temp folder)"
    )
    parser.add_argument(
        "--concurrency", type=positive_int, default=8, help="requests at once (and n of one request)"
    )
    parser.add_argument("--max-tokens", type=positive_int, default=48, help="tokens per completion")
    parser.add_argument("--stream-tokens", type=positive_int, default=200, help="tokens of the streamed answer")
    parser.add_argument("--repeats", type=positive_int, default=7, help="measured repeats of each side")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU threads of the worker's engine")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="the worker's device")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16"), help="the worker's dtype"
    )
    parser.add_argument("--batch-wait-ms", type=float, default=10.0, help="the worker's --http-batch-wait-ms")
    parser.add_argument(
        "--out", default=default_out("door.json"), help="where the JSON result goes (.md, .png beside it)"
    )
    args = parser.parse_args(argv)
    missing = missing_packages("openai", "fastapi", "uvicorn")
    if missing:
        parser.error(f"needs {', '.join(missing)}: pip install 'rlcore[http]' openai")
    with tempfile.TemporaryDirectory(prefix="rlcore-door-bench-") as workdir:
        result = run(args, workdir)
    write_outputs(result, args.out, markdown(result), lambda path: plot(result, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
