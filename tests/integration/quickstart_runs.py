"""The quickstart, shortened, as the multi-host and restart tests run it, and how they compare runs."""

from __future__ import annotations

import json
import os

import psutil
import yaml

from tests.integration.launch_utils import REPO

SFT_STEPS, RL_STEPS = 10, 6  # ten SFT steps: enough for the format reward to start (rewards to compare)


def quickstart(root: str, sft_steps: int, rl_steps: int) -> dict:
    """configs/quickstart.yaml, shortened: its SFT warm-up for `sft_steps`, then its GRPO stage
    for `rl_steps`, without evaluation; one rank per trainer node, two threads per process."""
    with open(os.path.join(REPO, "configs", "quickstart.yaml")) as f:
        cfg = yaml.safe_load(
            f.read().replace("${checkpoint_root_dir}", root)
        )  # paths for the rollout host too
    cfg["checkpoint_root_dir"] = root
    cfg["cluster"].update(threads_per_rank=2)
    del cfg["buffer"]["explorer_input"]["eval_tasksets"]
    sft, rl = cfg["stages"]
    sft["buffer"]["total_steps"] = sft_steps
    rl["buffer"]["total_steps"] = rl_steps
    rl["explorer"] = {"eval_on_startup": False, "eval_interval": 0}
    return cfg


def metrics(run_dir: str, stage: str) -> list[dict]:
    with open(os.path.join(run_dir, stage, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def same_steps(one: list[dict], other: list[dict], keys: tuple[str, ...]) -> None:
    assert [r["step"] for r in one] == [r["step"] for r in other]
    for a, b in zip(one, other, strict=True):
        for key in keys:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])


def same_training(one_dir: str, multi_dir: str) -> None:
    """Every step of both stages once, with the same losses, gradient norms and rewards."""
    sft_one, sft_multi = metrics(one_dir, "stage0_sft_warmup"), metrics(multi_dir, "stage0_sft_warmup")
    assert [r["step"] for r in sft_one] == list(range(1, SFT_STEPS + 1))
    same_steps(sft_one, sft_multi, ("sft/loss", "actor/grad_norm"))
    rl_one, rl_multi = metrics(one_dir, "stage1_rl"), metrics(multi_dir, "stage1_rl")
    assert [r["step"] for r in rl_one] == list(range(1, RL_STEPS + 1))
    same_steps(rl_one, rl_multi, ("rollout/reward_mean", "actor/loss", "actor/grad_norm"))
    assert any(r["rollout/reward_mean"] > 0 for r in rl_one)  # the comparison has something to compare


def trainer_rank(root: str, rank: int) -> psutil.Process:
    """The trainer rank `rank` of the run under `root` (any namespace: they share process ids)."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "rlcore.runtime.trainer_rank" in cmd and root in cmd and p.environ().get("RANK") == str(rank):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no trainer rank {rank} under {root}")


def logged(run_dir: str, stage: str, step: int) -> bool:
    path = os.path.join(run_dir, stage, "metrics.jsonl")
    return os.path.isfile(path) and any(json.loads(line)["step"] >= step for line in open(path))
