"""Entry point of every trainer rank (started by torch.distributed.run): runs the stages in order.

python -m torch.distributed.run ... -m rlcore.core.worker <run_dir>/launch/plan.json
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import sys

import torch
import torch.distributed as dist

from .checkpoint import latest_checkpoint
from .config import from_yaml, inherits_previous_model
from .config.loader import Stage
from .trainer_world import exit_world, init_world

SUMMARY = "stage_summary.json"


def stage_dir(run_dir: str, stage: Stage, num_stages: int) -> str:
    return run_dir if num_stages == 1 else os.path.join(run_dir, f"stage{stage.index}_{stage.name}")


def planned_steps(stage: Stage) -> int:
    from .data.taskset import load_tasks
    from .trainer import plan_steps

    tasks = load_tasks(stage.config.buffer.explorer_input.taskset, "buffer.explorer_input.taskset")
    return plan_steps(stage.config, len(tasks))[2]


def run_stage(
    stage: Stage, sdir: str, model_path: str, device: str, is_last: bool, plan: dict, reporter=None
) -> dict:
    from .monitor import build_monitors
    from .monitor.progress import StepProgress
    from .trainer import StageTrainer

    cfg = stage.config
    trainer = StageTrainer(
        stage, sdir, model_path, device, export_final_hf=not is_last,
        rollout_endpoints=plan.get("rollout_endpoints") or None,
        master_address=plan.get("master_address", "127.0.0.1"),
    )  # fmt: skip
    monitor = progress = None
    if dist.get_rank() == 0:
        monitor = build_monitors(
            list(cfg.monitor.monitor_type),
            sdir,
            cfg.project,
            f"{cfg.name}/{stage.name}",
            dataclasses.asdict(cfg),
        )
        progress = StepProgress(trainer.total_train_steps, desc=stage.name)
    try:
        eval_metrics = trainer.run(monitor, progress, reporter)
        if reporter is not None:
            reporter.heartbeat(
                stage.name, trainer.state.global_step, trainer.total_train_steps,
                trainer.state.policy_version, wait=False,
            )  # fmt: skip
    finally:
        if progress is not None:
            progress.close()
        if monitor is not None:
            monitor.close()
        if trainer.explorer is not None:
            trainer.explorer.close()
    final = latest_checkpoint(sdir)
    summary = {
        "stage": stage.name,
        "global_step": trainer.state.global_step,
        "stopped": trainer.stopped,
        "eval": eval_metrics,
        "final_checkpoint": final,
        "final_model": os.path.join(final, "hf")
        if final and os.path.isdir(os.path.join(final, "hf"))
        else None,
    }
    if dist.get_rank() == 0:
        with open(os.path.join(sdir, SUMMARY), "w") as f:
            json.dump(summary, f, indent=2)
    dist.barrier()
    del trainer
    gc.collect()
    return summary


def main(plan_path: str) -> int:
    with open(plan_path) as f:
        plan = json.load(f)
    device = plan["device"]
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=plan["log_level"] if rank == 0 else logging.WARNING,
        format=f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for name in ("transformers", "datasets", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if plan.get("threads_per_rank"):
        torch.set_num_threads(plan["threads_per_rank"])
    init_world(device)
    reporter = None
    try:
        stages = [Stage(s["index"], s["name"], from_yaml(s["config"])) for s in plan["stages"]]
        if rank == 0 and plan.get("run_address"):
            from ..client.base import ClientOptions
            from .run_reporter import RunReporter

            reporter = RunReporter(plan["run_address"], ClientOptions.from_control(stages[0].config.control))
        previous_model = None
        for stage in stages:
            sdir = stage_dir(plan["run_dir"], stage, len(stages))
            os.makedirs(sdir, exist_ok=True)
            summary_file = os.path.join(sdir, SUMMARY)
            if os.path.isfile(summary_file):  # finished in an earlier run that we are resuming?
                with open(summary_file) as f:
                    done = json.load(f)
                if done["global_step"] >= planned_steps(stage):
                    previous_model = done["final_model"]
                    continue
            model_path = stage.config.model.model_path
            if inherits_previous_model(stage.config):
                assert previous_model, (
                    f"stage {stage.name} inherits weights but the previous stage exported none"
                )
                model_path = previous_model
            summary = run_stage(stage, sdir, model_path, device, stage is stages[-1], plan, reporter)
            previous_model = summary["final_model"]
            if summary["stopped"]:
                break
    except ValueError as e:  # user-facing problems found at run time: one line, no traceback
        print(f"rlcore: error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if reporter is not None:
            reporter.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_world(main(sys.argv[1]))
