"""Entry point of every trainer rank under `rlcore launch` (started by torch.distributed.run):
rank 0 runs the loop (loop.py), commanding the other ranks, which follow its commands. Logs and
the progress bar go to stdout; a failure is written for the launcher to report in one line
(failure.py), its stderr (tracebacks) to the run's trainer log.

python -m rlcore.runtime.torchrun ... -m rlcore.runtime.trainer_rank <run_dir>/launch/plan.json
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..core.config.loader import Stage
from . import failure, nodes
from .launch_plan import LaunchPlan
from .lifecycle import die_with_parent
from .rank_entry import run_rank, sender_factory
from .trainer_world import Commander, TrainerWorld, exit_world


def _sender_factory(plan: LaunchPlan) -> Any:
    """Rank 0's way to reach the run's rollout workers (they join the sync group at the address
    the launch chose), with the run's control settings."""
    from ..client.base import ClientOptions

    def options(cfg: Any) -> ClientOptions:
        return ClientOptions.from_control(cfg.control, timeout=cfg.synchronizer.sync_timeout)

    return sender_factory(options, plan.device, sync_master_address(plan))


def sync_master_address(plan: LaunchPlan) -> str:
    """Where rank 0 offers the rollout workers' weight-sync group: the address the launch chose,
    or across hosts its own node's (torchrun's MASTER_ADDR: rank 0 may run on any node)."""
    if plan.num_nodes > 1 and os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    return plan.master_address


def read_plan(plan_path: str) -> LaunchPlan:
    """The launch's plan, once written: the launcher starts the trainer world beside the rollout
    workers and writes the plan (atomically) when they are ready. A rank dies with torchrun's agent,
    and that agent with the launcher, so a launch that fails first leaves no rank waiting."""
    if not os.path.exists(plan_path):
        # meanwhile, the imports every rank needs once it has the plan (seconds of CPU on their own)
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401

        from . import loop  # noqa: F401
    plan = nodes.read_plan(plan_path)
    assert plan is not None  # no stop event: it waits
    return plan


def restarted(plan: LaunchPlan, stages: list[Stage]) -> None:
    """After the launch restarted the world (trainer.max_restarts), every stage resumes from its last
    verified checkpoint: finished stages are skipped, the running one goes on from its checkpoint
    (its explorer's and experience buffer's position included), or from its start without one."""
    restart = plan.restart
    if not restart:
        return
    print(
        f"rlcore: trainer world restart {restart} of {plan.max_restarts} "
        "(trainer.max_restarts): resuming from the last checkpoint",
        flush=True,
    )
    for stage in stages:
        stage.config.continue_from_checkpoint = True


def main(plan_path: str) -> int:
    die_with_parent()  # torchrun's agent: a rank never outlives it (also while it waits for the plan)
    # what the loop runs with (HF datasets, pandas among it: seconds of CPU), imported while the
    # launch starts the rollout workers, whose readiness the plan waits for
    from . import handles, loop  # noqa: F401

    plan = read_plan(plan_path)
    device = plan.device
    rank = int(os.environ.get("RANK", 0))
    launch_dir = os.path.join(plan.run_dir, "launch")
    try:
        return run_rank(
            rank, device, lambda commands: _lead(plan, TrainerWorld(device, _sender_factory(plan)), commands),
            log_level=plan.log_level, threads=plan.threads_per_rank,
            collective_timeout_s=plan.collective_timeout_s, keep_serving=False,
        )  # fmt: skip
    except Exception as e:  # for the launcher to say in one line; the traceback goes to a file
        failure.report(launch_dir, f"rank{rank}", e)
        return 2 if isinstance(e, ValueError) else 1


def _lead(plan: LaunchPlan, world: TrainerWorld, commands: Any) -> int:
    """Rank 0: run every stage through the loop, then release the other ranks."""
    from .handles import LocalTrainer
    from .loop import RunContext, run_stages

    reporter = None
    command = Commander(world, commands)
    try:
        stages = plan.stage_list()
        restarted(plan, stages)
        if plan.run_address:
            from ..client.base import ClientOptions
            from .run_reporter import RunReporter

            control = stages[0].config.control
            reporter = RunReporter(plan.run_address, ClientOptions.from_control(control), control.heartbeat_interval)
        run = RunContext(
            plan.run_dir, plan.device, plan.rollout_endpoints, reporter,
            workers=reporter.rollout_workers if reporter is not None and plan.workers_managed else None,
        )  # fmt: skip
        run_stages(stages, LocalTrainer(command), run)
        return 0
    finally:
        if reporter is not None:
            reporter.close()
        world.close_stage()
        if not command.interrupted:  # the other ranks wait for a command: release them
            command.shutdown()


if __name__ == "__main__":
    exit_world(main(sys.argv[1]))
