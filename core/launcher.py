"""`rlcore launch`: validate, prepare assets, start the trainer world with torch.distributed.run,
and report the result.

The launch process is the controller; trainer ranks are started through torch's own launcher
(torchrun), which also handles multi-node rendezvous.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .checkpoint import list_checkpoints
from .config import ConfigError, Stage, inherits_previous_model, load_config, resolve_stages, to_yaml
from .worker import SUMMARY, stage_dir


def resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "cluster.device is cuda but no CUDA device is visible; use cluster.device=cpu (or auto)"
        )
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def prepare_assets(stages: list[Stage]) -> None:
    """Generate missing synthetic tasksets and build a missing scratch model (deterministic, so
    doing it once here, before any rank starts, is enough)."""
    from .data.taskset import ensure_taskset
    from .scratch_model import ensure_model

    for stage in stages:
        cfg = stage.config
        ensure_taskset(cfg.buffer.explorer_input.taskset, "buffer.explorer_input.taskset")
        for i, ts in enumerate(cfg.buffer.explorer_input.eval_tasksets):
            ensure_taskset(ts, f"buffer.explorer_input.eval_tasksets[{i}]")
        if inherits_previous_model(cfg):
            continue
        if ensure_model(cfg.model.model_path, cfg.model.scratch, cfg.model.max_model_len, cfg.seed):
            print(f"rlcore: built a scratch model in {cfg.model.model_path}", flush=True)


def preflight(stages: list[Stage]) -> None:
    """Resolve everything a rank would otherwise discover minutes later: reward functions (user
    import paths included), monitor packages and the model folder."""
    from ..rollout.rewards.compose import build_reward
    from .monitor import check_monitor_dependencies

    for s in stages:
        cfg = s.config
        check_monitor_dependencies(list(cfg.monitor.monitor_type))
        tasksets = [("buffer.explorer_input.taskset", cfg.buffer.explorer_input.taskset)]
        tasksets += [
            (f"buffer.explorer_input.eval_tasksets[{i}]", t)
            for i, t in enumerate(cfg.buffer.explorer_input.eval_tasksets)
        ]
        for key, ts in tasksets:
            try:
                build_reward(list(ts.reward_fn), list(ts.reward_weights) or None)
            except ValueError as e:
                raise ConfigError(f"{key}.reward_fn: {e}") from None
        model = cfg.model
        if not inherits_previous_model(cfg) and not model.scratch.enabled:
            if not os.path.isfile(os.path.join(model.model_path, "config.json")):
                raise ConfigError(
                    f"model.model_path: '{model.model_path}' has no config.json (is it an HF model folder?)"
                )


def check_run_dir(run_dir: str, stages: list[Stage], resume: bool) -> None:
    had_run = any(
        list_checkpoints(stage_dir(run_dir, s, len(stages)))
        or os.path.isfile(os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY))
        for s in stages
    )
    if had_run and not resume:
        raise ConfigError(
            f"{run_dir} already holds a run: resume it with continue_from_checkpoint=true, "
            f"or start a new one with name=<new name> (or delete the folder)"
        )


def torchrun_command(plan_path: str, cluster, project: str, name: str) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cluster.ranks_per_node)]
    if cluster.num_nodes == 1 and not cluster.rdzv_endpoint:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += ["--nnodes", str(cluster.num_nodes), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", cluster.rdzv_endpoint, "--rdzv-id", f"{project}-{name}"]  # fmt: skip
    return cmd + ["-m", "rlcore.core.worker", plan_path]


def print_summary(run_dir: str, stages: list[Stage], elapsed_s: float) -> None:
    print(f"\nrlcore: finished in {elapsed_s / 60:.1f} min; run folder {run_dir}")
    previous: dict[str, float] = {}
    for s in stages:
        path = os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            summary = json.load(f)
        accs = {k: v for k, v in summary["eval"].items() if k.endswith("/accuracy")}
        parts = []
        for k, v in accs.items():
            delta = f" ({(v - previous[k]) * 100:+.1f} points)" if k in previous else ""
            parts.append(f"{k.removeprefix('eval/')} {v * 100:.1f}%{delta}")
        print(
            f"  after stage {s.index} {s.name} (step {summary['global_step']}): "
            + ("; ".join(parts) or "no evaluation")
        )
        previous.update(accs)


def launch(config_path: str, overrides: list[str], strategy: str | None) -> int:
    cfg = load_config(config_path, overrides, strategy)
    stages = resolve_stages(cfg)
    base = stages[0].config
    preflight(stages)
    device = resolve_device(base.cluster.device)
    run_dir = os.path.abspath(os.path.join(base.checkpoint_root_dir, base.project, base.name))
    check_run_dir(run_dir, stages, base.continue_from_checkpoint)
    prepare_assets(stages)

    launch_dir = os.path.join(run_dir, "launch")
    os.makedirs(launch_dir, exist_ok=True)
    cores = os.cpu_count() or 1
    threads = base.cluster.threads_per_rank or max(1, cores // base.cluster.ranks_per_node)
    plan = {
        "run_dir": run_dir,
        "device": device,
        "log_level": base.log.level,
        "threads_per_rank": threads,
        "stages": [{"index": s.index, "name": s.name, "config": to_yaml(s.config)} for s in stages],
    }
    plan_path = os.path.join(launch_dir, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f, indent=2)
    world = base.cluster.num_nodes * base.cluster.ranks_per_node
    print(
        f"rlcore: {len(stages)} stage(s) [{', '.join(s.name for s in stages)}], strategy {base.trainer.strategy}, "
        f"{world} trainer rank(s) on {device}; run folder {run_dir}",
        flush=True,
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    start = time.time()
    try:
        rc = subprocess.call(torchrun_command(plan_path, base.cluster, base.project, base.name), env=env)
    except KeyboardInterrupt:
        print("rlcore: interrupted; resume later with continue_from_checkpoint=true", file=sys.stderr)
        return 130
    if rc != 0:
        print(
            f"rlcore: error: the trainer world exited with code {rc} (see the messages above)",
            file=sys.stderr,
        )
        return rc
    print_summary(run_dir, stages, time.time() - start)
    return 0
