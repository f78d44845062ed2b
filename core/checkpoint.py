"""Checkpoints: `<stage_dir>/global_step_N/` holding the strategy's sharded model/optimizer/scheduler
state, the trainer state (step, data position, policy version, KL controller), every rank's RNG
states and, optionally, an HF-format export.

A checkpoint is written into `global_step_N.tmp/` and renamed when complete, so a crash mid-save
never leaves a checkpoint that looks valid. `latest` names the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

STEP_DIR = re.compile(r"^global_step_(\d+)$")
TRAINER_STATE = "trainer_state.json"


@dataclass
class TrainerState:
    """Everything besides model/optimizer that a resumed run needs to continue identically."""

    global_step: int = 0
    """Optimizer steps taken."""
    explore_step: int = 0
    """Batches of tasks consumed (the data position)."""
    policy_version: int = 0
    """Version of the weights the engines hold."""
    kl_ctrl: dict[str, Any] = field(default_factory=dict)


def step_dir(stage_dir: str, step: int) -> str:
    return os.path.join(stage_dir, f"global_step_{step}")


def list_checkpoints(stage_dir: str) -> list[int]:
    """Steps of complete checkpoints, ascending."""
    if not os.path.isdir(stage_dir):
        return []
    steps = []
    for name in os.listdir(stage_dir):
        m = STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(stage_dir, name, TRAINER_STATE)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_checkpoint(stage_dir: str) -> str | None:
    steps = list_checkpoints(stage_dir)
    return step_dir(stage_dir, steps[-1]) if steps else None


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():  # this rank's GPU only: a resume may see another set of GPUs
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # the current device, which init_world chose


def save_checkpoint(
    stage_dir: str,
    strategy: Any,
    state: TrainerState,
    max_to_keep: int | None,
    export_hf: Callable[[str], None] | None = None,
) -> str:
    """Collective: every rank calls it. Returns the final checkpoint folder."""
    rank = dist.get_rank()
    final = step_dir(stage_dir, state.global_step)
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    strategy.save_checkpoint(os.path.join(tmp, "model"))
    torch.save(_rng_state(), os.path.join(tmp, f"rng_rank{rank}.pt"))
    if export_hf is not None:
        export_hf(os.path.join(tmp, "hf"))  # collective
    dist.barrier()
    if rank == 0:
        with open(os.path.join(tmp, TRAINER_STATE), "w") as f:
            json.dump(asdict(state), f, indent=2)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        with open(os.path.join(stage_dir, "latest"), "w") as f:
            f.write(os.path.basename(final) + "\n")
        if max_to_keep:
            for old in list_checkpoints(stage_dir)[:-max_to_keep]:
                shutil.rmtree(step_dir(stage_dir, old), ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(path: str, strategy: Any) -> TrainerState:
    """Collective: restore the strategy, this rank's RNG states, and return the trainer state."""
    rank = dist.get_rank()
    strategy.load_checkpoint(os.path.join(path, "model"))
    rng_file = os.path.join(path, f"rng_rank{rank}.pt")
    if not os.path.isfile(rng_file):
        raise ValueError(
            f"checkpoint {path} was written by fewer trainer ranks (no {os.path.basename(rng_file)}); "
            f"resume with the same cluster.num_nodes * cluster.ranks_per_node"
        )
    _set_rng_state(torch.load(rng_file, weights_only=False))
    with open(os.path.join(path, TRAINER_STATE)) as f:
        return TrainerState(**json.load(f))
