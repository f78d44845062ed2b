"""Helpers to run `rlcore launch` for real (torchrun, gloo ranks) on tiny configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import yaml

from rlcore.runtime import fork_client
from rlcore.runtime.nodes import rank_entry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_m(module: str, *args: str) -> list[str]:
    """`python -m module args`: a fork of the suite's fork server where one runs (tests/conftest.py)."""
    if os.environ.get(fork_client.ENV):
        return fork_client.client_command(None, module, *args)
    return [sys.executable, "-m", module, *args]


def torchrun(ranks: int, module: str, *args: str) -> list[str]:
    """torchrun (standalone) running `python -m module args` in each of `ranks` ranks, torchrun and
    the ranks forked from the suite's fork server where one runs."""
    return [*python_m("rlcore.runtime.torchrun"), "--standalone", f"--nproc-per-node={ranks}", *rank_entry(module, *args)]


def tiny_grpo_config(root: str, **sections) -> dict:
    """A GRPO run on the scratch model that takes seconds per step on CPU."""
    cfg = {
        "project": "it",
        "name": "run",
        "checkpoint_root_dir": root,
        "seed": 7,
        "model": {
            "model_path": os.path.join(root, "model"),
            "max_model_len": 48,
            "max_prompt_tokens": 16,
            "max_response_tokens": 8,
            "scratch": {
                "enabled": True,
                "hidden_size": 64,
                "num_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "intermediate_size": 128,
            },
        },
        "cluster": {"device": "cpu", "threads_per_rank": 1},
        "algorithm": {"repeat_times": 4, "kl_loss_coef": 0.01, "optimizer": {"lr": 1e-3}},
        "buffer": {
            "batch_size": 4,
            "total_steps": 2,
            "explorer_input": {
                "taskset": {
                    "path": os.path.join(root, "train.jsonl"),
                    "generator": "arithmetic",
                    "generator_args": {"num_tasks": 64, "max_operand": 9},
                    "rollout_args": {"max_tokens": 8},
                    "reward_fn": ["tests.integration.rewards:distinct_chars"],
                }
            },
        },
        "monitor": {"monitor_type": ["jsonl"]},
    }
    for key, value in sections.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def heldout_taskset(root: str, num_tasks: int) -> dict:
    """An arithmetic eval taskset ("heldout", greedy) generated into `root`."""
    return {
        "name": "heldout",
        "path": os.path.join(root, "test.jsonl"),
        "generator": "arithmetic",
        "generator_args": {"part": "test", "num_tasks": num_tasks, "max_operand": 9},
        "rollout_args": {"temperature": 0.0, "max_tokens": 8},
    }


def launch(cfg: dict, path: str, *overrides: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    cmd = [sys.executable, "-m", "rlcore.cli", "launch", path, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    # the trainer ranks' stderr (warnings, tracebacks) goes to the run's trainer log, not the terminal
    run_dir = os.path.join(
        cfg.get("checkpoint_root_dir", "."), cfg.get("project", "rlcore"), cfg.get("name", "run")
    )
    log = os.path.join(REPO, run_dir, "launch", "trainer.log")
    proc.trainer_log = open(log).read() if os.path.isfile(log) else ""  # type: ignore[attr-defined]
    assert proc.returncode == 0, (
        f"launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n"
        f"trainer log:\n{proc.trainer_log[-6000:]}"  # type: ignore[attr-defined]
    )
    return proc


def read_metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def wait_for_port_file(
    port_file: str, proc: subprocess.Popen, what: str, timeout_s: float = 120, log_file: str | None = None
) -> str:
    """The address a `rollout serve` / `trainer serve` process writes to its --port-file once it
    listens. Fails (killing the process, with its log tail when given) if it exits first or does not
    start within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            rc = proc.poll()
            proc.kill()
            log = open(log_file).read()[-6000:] if log_file and os.path.exists(log_file) else ""
            raise AssertionError(f"{what} did not start within {timeout_s:.0f} s (exit code {rc})\n{log}")
        time.sleep(0.2)
    with open(port_file) as f:
        return f.read().strip()
