"""trainer.remote: the loop runs in the launch process and drives the service there (a
TrainerService, `rlcore trainer serve`; or a Tinker service), watched (service_watch.py): one that
stops answering ends the run in one line, and a stop request does not wait for calls it cannot
answer."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ..client.base import ClientOptions
from ..client.trainer import TrainerClient
from ..core.config import Stage
from ..core.signals import StopSignals
from .handles import RemoteHandle, RemoteTrainer
from .launch_plan import LaunchPlan
from .loop import RunContext, run_stages
from .run_reporter import RunReporter
from .service_watch import ServiceWatch


def drive_remote(stages: list[Stage], plan: LaunchPlan, stops: StopSignals) -> int:
    """Every stage of `plan` (launch/plan.json) against trainer.remote; `stops`: the launch's
    SIGINT/SIGTERM handling."""
    base = stages[0].config
    options = ClientOptions.from_control(base.control)
    reporter = RunReporter(str(plan.run_address), options, base.control.heartbeat_interval)
    run = RunContext(
        plan.run_dir, plan.device, plan.rollout_endpoints, reporter,
        workers=reporter.rollout_workers if plan.workers_managed else None,
    )  # fmt: skip
    try:
        handle = _remote_handle(stages[0], options)
        watch = ServiceWatch(
            handle.peer, handle.answers, base.control.heartbeat_interval, lambda: stops.received is not None
        )
        ok = False
        try:
            with loop_logs(plan.log_level), watch:
                run_stages(stages, handle, run)
            ok = True
        finally:
            handle.close(ok, watch.answering)
    finally:
        reporter.close()
    return 0


def _remote_handle(first: Stage, options: ClientOptions) -> RemoteHandle:
    """The handle of the service trainer.remote names (the first stage's: the plan's role remote)."""
    address = str(first.config.trainer.remote)
    if first.plan.trainer == "tinker":
        from .tinker.trainer import TinkerTrainer

        tinker = TinkerTrainer(address, first.config.trainer.tinker.api_key_env)
        print(f"rlcore: training on {tinker.peer}", flush=True)
        return tinker
    client = TrainerClient(address, options)
    try:
        world_size = client.get_state(timeout=30).world_size
    except BaseException:
        client.close()
        raise
    print(f"rlcore: remote trainer {address}: {world_size} rank(s)", flush=True)
    return RemoteTrainer(client)


@contextmanager
def loop_logs(level: str) -> Iterator[None]:
    """rlcore's records to stdout while the loop runs in this process, as rank 0's go there when it
    runs in the trainer world (runtime/rank_logs.py): the resume's line, the loop's warnings."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("[loop] %(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    rlcore_log = logging.getLogger("rlcore")
    previous = rlcore_log.level
    rlcore_log.addHandler(handler)
    rlcore_log.setLevel(level)
    try:
        yield
    finally:
        rlcore_log.removeHandler(handler)
        rlcore_log.setLevel(previous)
