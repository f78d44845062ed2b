"""`rlcore launch`: validate, prepare assets, start the trainer world with torch.distributed.run,
and report the result.

The launch process is the controller; trainer ranks are started through torch's own launcher
(torchrun), which also handles multi-node rendezvous.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ..core.config import ConfigError, Stage, to_yaml
from ..core.config.plan import RunPlan, explores_only, plan_launch
from ..core.data.prompt_lengths import check_prompt_lengths
from ..core.signals import StopSignals
from ..weights.follower import wait_for_weights
from ..weights.publish import pin_newest
from . import failure, paths
from .child import QUIET_DATASETS, process_env, quiet_datasets, rank_threads
from .control_plane import control_plane, ensure_token
from .explore_launch import drive_explorer
from .launch_plan import LaunchPlan
from .lifecycle import end_process
from .loop import planned_steps
from .nodes import PLAN, join_world, log_size, node_log, silent_nodes, start_world, torchrun_command
from .paths import EXPLORER_DIR, SUMMARY, published_dir, stage_dir, trainer_stage_dir
from .placement import GpuPlacement
from .preflight import (
    check_model_lengths,
    check_run_dir,
    check_strategies,
    finished,
    local_device_count,
    preflight,
    prepare_assets,
    resolve_device,
)
from .remote_loop import drive_remote
from .run_lock import RunLock
from .workers import (
    gpu_placement,
)

STOP_ANNOUNCE = "stopping after the current step (a checkpoint first); again to stop at once"
"""What `rlcore launch` says at a first SIGINT/SIGTERM."""


def print_summary(run_dir: str, stages: list[Stage], elapsed_s: float) -> None:
    summaries = {}
    for s in stages:
        path = os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY)
        if os.path.isfile(path):
            with open(path) as f:
                summaries[s.index] = json.load(f)
    stopped = next((s for s in stages if summaries.get(s.index, {}).get("stopped")), None)
    if stopped is None:
        print(f"\nrlcore: finished in {elapsed_s / 60:.1f} min; run folder {run_dir}")
    else:
        print(
            f"\nrlcore: stopped at step {summaries[stopped.index]['global_step']} of {planned_steps(stopped)} "
            f"(stage {stopped.index} {stopped.name}) after {elapsed_s / 60:.1f} min, with a checkpoint; resume "
            f"with continue_from_checkpoint=true; run folder {run_dir}"
        )
    previous: dict[str, float] = {}
    for s in stages:
        if s.index not in summaries:
            continue
        summary = summaries[s.index]
        accuracy = ("/accuracy", "/pair_accuracy")  # a policy's, a reward model's
        accs = {k: v for k, v in summary["eval"].items() if k.endswith(accuracy)} or {
            k: v for k, v in summary["eval"].items() if k.endswith("/reward_mean")
        }  # an environment that scores itself reports its reward
        parts = []
        for k, v in accs.items():
            if k.endswith(accuracy):
                delta = f" ({(v - previous[k]) * 100:+.1f} points)" if k in previous else ""
                parts.append(f"{k.removeprefix('eval/')} {v * 100:.1f}%{delta}")
            else:
                parts.append(f"{k.removeprefix('eval/')} {v:.3f}" + (f" ({v - previous[k]:+.3f})" if k in previous else ""))
        print(
            f"  after stage {s.index} {s.name} (step {summary['global_step']}): "
            + ("; ".join(parts) or "no evaluation")
        )
        previous.update(accs)


def launch(cfg: Any, stages: list[Stage]) -> int:
    """Run the config `cfg` (as load_config gives it) whose stages `resolve_stages` validated."""
    os.environ.setdefault(QUIET_DATASETS, "1")  # the launch command sets it first
    quiet_datasets()  # where a warm server's fork imported datasets before the variable was set
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    explorer = explores_only(cfg)  # this launch is a decoupled run's explorer
    num_stages = len(stages)
    run_plan = plan_launch([s.plan for s in stages], explorer)
    stages = [stages[p.index] for p in run_plan.stages]
    base = stages[0].config
    preflight(stages)
    device = resolve_device(base.cluster.device)
    if not explorer:
        check_strategies(stages, device)
    placement = gpu_placement(stages, device, os.environ, local_device_count() if device == "cuda" else 0)
    if placement is not None and placement.shared:
        print(
            "rlcore: rollout workers share GPUs with the trainer (synchronizer.sync_method checkpoint); "
            "explorer.rollout_model.gpu_memory_utilization must leave room for the trainer",
            flush=True,
        )
    run_dir = paths.run_dir(base)
    if explorer:
        run_dir = os.path.join(run_dir, EXPLORER_DIR)
    if base.cluster.num_nodes > 1 and not os.environ.get(base.control.token_env):
        raise ConfigError(
            f"cluster.num_nodes is {base.cluster.num_nodes}: the hosts of a run share its token; set "
            f"${base.control.token_env} to the same secret on every host (e.g. `openssl rand -hex 32`)"
        )
    if base.cluster.node_rank > 0:  # node 0 prepares and drives the run; this node lends its ranks
        return join_world(stages, device, run_dir)
    lock = RunLock(run_dir)
    took_over = lock.acquire()
    if took_over:
        print(f"rlcore: warning: {took_over}", file=sys.stderr, flush=True)
    launch_dir = os.path.join(run_dir, "launch")
    failure.clear(launch_dir)
    world: WorldProcess | None = None
    try:
        try:
            check_run_dir(run_dir, stages, base.continue_from_checkpoint)
            assert lock.fd is not None
            if run_plan.role == "trainer" and not base.continue_from_checkpoint:
                # the world's ranks import (seconds of CPU each) while this process prepares the
                # assets; they wait for the plan. A resume first checks that steps are left.
                world = trainer_world(base, placement, launch_dir, lock.fd)
            if explorer:  # its model is what the trainer publishes; the trainer checks the lengths
                prepare_assets(stages, model=False)
            else:
                prepare_assets(stages)
                check_model_lengths(stages)
                check_prompt_lengths(stages)
                if base.continue_from_checkpoint and finished(run_dir, stages):
                    print(
                        f"rlcore: nothing to resume: every stage of the run in {run_dir} trained all its "
                        "steps already (raise buffer.total_steps or total_epochs to train on, or start a new "
                        "run with name=<new name>)",
                        flush=True,
                    )
                    return 0
            return run(stages, run_plan, device, placement, run_dir, lock.fd, num_stages, world)
        except BaseException:
            if world is not None:
                world.end()  # a launch that fails before or beside its world leaves no rank waiting
            raise
    except ValueError:  # the user's to fix: the command line says it in one line
        raise
    except Exception as e:  # anything else, in this process (e.g. the loop driving a remote trainer)
        print(f"rlcore: error: {failure.report(launch_dir, 'launcher', e)}", file=sys.stderr)
        return 1
    finally:
        lock.release()


def run(
    stages: list[Stage], run_plan: RunPlan, device: str, placement: GpuPlacement | None, run_dir: str,
    lock_fd: int, num_stages: int | None = None, world: WorldProcess | None = None,
) -> int:  # fmt: skip
    """Serve the control plane, start the workers and the trainer world (`world` when the launch
    started it already; or drive a remote one, or explore: mode explore) and wait; SIGINT/SIGTERM
    stop the run after its current step (core/signals.StopSignals). `num_stages`: the config's stages,
    of which `stages` may be some."""
    base = stages[0].config
    num_stages = num_stages or len(stages)
    launch_dir = os.path.join(run_dir, "launch")
    worker_version, worker_model = (
        _published_start(stages[0], num_stages, launch_dir) if run_plan.role == "explorer" else (-1, None)
    )
    threads = rank_threads(base.cluster)
    _announce(stages, run_plan, device, run_dir)
    start = time.time()
    lost_nodes = ""
    try:
        with control_plane(
            base, stages, device, launch_dir, placement, keep_fds=(lock_fd,), worker_model=worker_model
        ) as plane:
            controller = plane["run"]
            plan_path = os.path.join(launch_dir, PLAN)
            if run_plan.role == "trainer" and world is None:
                # the trainer world starts beside the rollout workers (each takes seconds of imports
                # and set-up); its ranks wait for the plan, written once the workers are ready
                world = trainer_world(base, placement, launch_dir, lock_fd)
            try:
                plane["workers_ready"]()
                plan = _rank_plan(stages, run_plan, base, run_dir, device, threads, plane, worker_version)
                plan.write(plan_path)
                controller.mark_running()
            except BaseException:  # the workers did not start (or the plan could not be written)
                if world is not None:
                    world.end()
                raise
            with StopSignals(
                controller.request_stop, base.control.stop_grace_s, announce=STOP_ANNOUNCE
            ) as stops:
                try:
                    if run_plan.role == "explorer":
                        rc = drive_explorer(stages, num_stages, plan)
                    elif run_plan.role == "remote":
                        rc = drive_remote(stages, plan, stops)
                    else:
                        assert world is not None
                        rc = world.run(controller, plan, stops)
                except KeyboardInterrupt:  # a second signal, or the stop grace ran out
                    stage, step, total = controller.progress()
                    print(f"rlcore: stopped at step {step} of {total} ({stage or 'before training'}) "
                          f"{_last_checkpoint(run_dir, stages, num_stages, stage, step)}", file=sys.stderr)  # fmt: skip
                    return 130 if stops.received in (None, signal.SIGINT) else stops.exit_code
            if rc == 0:
                controller.mark_finished()
            else:
                controller.mark_failed(f"the trainer world exited with code {rc}")
                lost_nodes = silent_nodes(controller, base.control)
    except KeyboardInterrupt:  # Ctrl-C while the workers were starting
        print("rlcore: interrupted before training started", file=sys.stderr)
        return 130
    except (TimeoutError, RuntimeError) as e:  # rollout workers that did not start
        raise ConfigError(str(e)) from None
    if rc != 0:
        why = world.why(rc) if world is not None else failure.world_failure(launch_dir, "", 0) or f"exit code {rc}"
        print(f"rlcore: error: {lost_nodes}{why}", file=sys.stderr)
        return rc
    print_summary(run_dir, stages, time.time() - start)
    return 0 if stops.received is None else stops.exit_code


def _last_checkpoint(run_dir: str, stages: list[Stage], num_stages: int, stage: str, step: int) -> str:
    """What a run stopped at once (a second signal, the grace out) left to resume from."""
    from ..core.checkpoint import list_checkpoints
    from .tinker.trainer import read_record

    current = next((s for s in stages if s.name == stage), None)
    saved: list[int] = []
    if current is not None:  # a Tinker service's checkpoints: those the stage's record lists
        sdir = stage_dir(run_dir, current, num_stages)
        saved = list_checkpoints(sdir) or [r["global_step"] for r in read_record(sdir)]
    if saved and saved[-1] >= step:
        return f"with its checkpoint of step {saved[-1]}; resume with continue_from_checkpoint=true"
    last = f"the last is step {saved[-1]}" if saved else "this stage has none yet"
    return f"before its final checkpoint ({last}); resume from it with continue_from_checkpoint=true"


def trainer_world(base: Any, placement: GpuPlacement | None, launch_dir: str, lock_fd: int) -> WorldProcess:
    """This node's trainer world, started now; its ranks import, then wait for launch/plan.json."""
    plan_path = os.path.join(launch_dir, PLAN)
    if os.path.exists(plan_path):
        os.remove(plan_path)  # an earlier launch's: the ranks must wait for this one's
    os.makedirs(launch_dir, exist_ok=True)
    ensure_token(base.control.token_env)  # the ranks inherit the run's token (control_plane keeps it)
    env = process_env(base.cluster, rank_threads(base.cluster), None if placement is None else placement.trainer)
    return WorldProcess(base, plan_path, launch_dir, env, lock_fd)


def _published_start(first: Stage, num_stages: int, launch_dir: str) -> tuple[int, Callable[[], str] | None]:
    """Mode explore: the version of the first weights the trainer publishes, which the rollout
    workers start from, and what gives a (re)started worker the newest ones: pinned under
    launch/pinned_weights, since the trainer prunes older versions (maybe before the worker read it)."""
    base = first.config
    folder = published_dir(trainer_stage_dir(base, first, num_stages))
    print(f"rlcore: waiting for the trainer's weights in {folder}", flush=True)
    weights = wait_for_weights(folder, -1, base.buffer.trainer_input.experience_buffer.max_wait_s, f"stage {first.name}")
    assert weights is not None  # no stop event: it returns weights or raises
    version, path = weights
    pins = os.path.join(launch_dir, "pinned_weights")
    return version, lambda: pin_newest(folder, pins, keep=base.explorer.rollout_model.engine_num + 1)


def _announce(stages: list[Stage], run_plan: RunPlan, device: str, run_dir: str) -> None:
    base = stages[0].config
    if run_plan.role == "explorer":
        what = f"explore only, rollout on {device} (the trainer runs in its own launch)"
    elif run_plan.role == "remote":
        what = f"trained by {base.trainer.remote}"
    else:
        what = f"strategy {base.trainer.strategy}, {base.cluster.ranks} trainer rank(s) on {device}"
    print(
        f"rlcore: {len(stages)} stage(s) [{', '.join(s.name for s in stages)}], {what}; run folder {run_dir}",
        flush=True,
    )


def _rank_plan(
    stages: list[Stage], run_plan: RunPlan, base: Any, run_dir: str, device: str, threads: int,
    plane: dict[str, Any], worker_version: int,
) -> LaunchPlan:  # fmt: skip
    """What the trainer ranks (and the loop in this process) read: launch/plan.json."""
    return LaunchPlan(
        run_dir=run_dir, device=device, log_level=base.log.level, threads_per_rank=threads,
        num_nodes=base.cluster.num_nodes, max_restarts=base.trainer.max_restarts,
        collective_timeout_s=base.cluster.collective_timeout_s,
        run_address=plane["run_address"], rollout_endpoints=plane["rollout_endpoints"],
        workers_managed=plane["workers_managed"],
        master_address=plane["master_address"], worker_version=worker_version,
        run_plan=run_plan.as_dict(),
        stages=[
            {"index": s.index, "name": s.name, "config": to_yaml(s.config), "plan": s.plan.as_dict()}
            for s in stages
        ],
    )  # fmt: skip


class WorldProcess:
    """This node's share of the trainer world (torchrun), started at once: its ranks wait for the
    plan. `run` waits for it and restarts it (trainer.max_restarts)."""

    def __init__(self, base: Any, plan_path: str, launch_dir: str, env: dict[str, str], lock_fd: int):
        self.base, self.plan_path, self.launch_dir, self.env, self.lock_fd = base, plan_path, launch_dir, env, lock_fd
        self.command = torchrun_command(plan_path, base.cluster, base.project, base.name)
        self.log = os.path.join(launch_dir, node_log(base.cluster))
        self.node_failed = ""
        """Another node's line, when its share failed first."""
        self._start()

    def _start(self) -> None:
        self.log_start = log_size(self.log)
        self.proc = start_world(self.command, self.env, self.log, (self.lock_fd,))

    def end(self) -> None:
        end_process(self.proc)

    def run(self, controller: Any, plan: LaunchPlan, stops: StopSignals) -> int:
        """Wait for the world; start it again while restart_due says so; its exit code."""
        rc, self.node_failed = wait_trainer_world(self.proc, controller, 0)
        while restart_due(
            rc, plan, self.base, stops, self.node_failed or failure.world_failure(self.launch_dir, self.log, self.log_start)
        ):
            failure.clear(self.launch_dir)
            plan.write(self.plan_path)
            self._start()
            rc, self.node_failed = wait_trainer_world(self.proc, controller, plan.restart)
        return rc

    def why(self, rc: int) -> str:
        """The one line that says why the world exited with `rc`."""
        return (
            self.node_failed
            or failure.world_failure(self.launch_dir, self.log, self.log_start)  # no log: first_failure
            or f"the trainer world exited with code {rc} without saying why (killed, or out of memory?); "
            f"its output is in {os.path.join(self.launch_dir, failure.TRAINER_LOG)}"
        )


def restart_due(rc: int, plan: LaunchPlan, base: Any, stops: StopSignals, why: str | None) -> bool:
    """Whether a trainer world that exited with `rc` (for the reason `why`, when one is known) is
    started again (trainer.max_restarts): it failed, not on a problem of the user's to fix (a
    ValueError: code 2) nor on a stop request, and restarts are left. The plan then counts the
    restart: its ranks resume from the last checkpoint (trainer_rank.py); the workers and the
    controller carry on."""
    done = plan.restart
    if rc in (0, 2) or stops.received is not None or done >= base.trainer.max_restarts:
        return False
    plan.restart = done + 1
    print(
        f"rlcore: the trainer world failed ({why or f'exit code {rc}'}); restart {done + 1} of "
        f"{base.trainer.max_restarts} (trainer.max_restarts) from the last checkpoint",
        file=sys.stderr,
        flush=True,
    )
    return True


def wait_trainer_world(proc: subprocess.Popen, controller: Any, attempt: int) -> tuple[int, str]:
    """The exit code of this node's share of the trainer world (start `attempt`: 0, then one more
    per restart), and the line of another node whose share failed first ("" when none did). Such a
    node says so in its heartbeat, and this node's share is then ended at once: its ranks may wait
    for the dead ones in a collective until cluster.collective_timeout_s (seen: a rank killed on
    node 1 left rank 0 in an all-gather). Interrupted, the launcher ends the world."""
    try:
        while True:
            try:
                return proc.wait(timeout=1.0), ""
            except subprocess.TimeoutExpired:
                pass
            failed = controller.node_failures(attempt)
            if failed:
                index, why = failed[0]
                print(
                    f"rlcore: trainer node {index}'s ranks failed; ending this node's share of the trainer world",
                    file=sys.stderr,
                    flush=True,
                )
                return end_process(
                    proc
                ) or 1, f"trainer node {index}'s share of the trainer world failed: {why}"
    except BaseException:
        end_process(proc)
        raise
