"""The launch's control plane: RunService (with the buffer queues a mode-train stage serves) and the
rollout workers the run's stages need, for the run's lifetime."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..core.config import Stage
from ..core.rpc.cli import write_atomic
from .placement import GpuPlacement
from .workers import RolloutWorkers, check_endpoints, worker_stages, workers_to_join, workers_to_start


def ensure_token(token_env: str) -> None:
    """Processes of one run share a token; without one in the environment, make a random one that
    the processes this launch starts inherit."""
    if not os.environ.get(token_env):
        os.environ[token_env] = secrets.token_urlsafe(32)


@contextmanager
def control_plane(
    base: Any, stages: list[Stage], device: str, launch_dir: str, placement: GpuPlacement | None = None,
    keep_fds: tuple[int, ...] = (), worker_model: Callable[[], str] | None = None,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Serve RunService (and a buffer queue that a mode-train stage reads) for the run's lifetime and
    start (then stop) the rollout workers it needs, from `worker_model` (default: the first stage's
    model). Yields what the trainer ranks must know: run address, rollout endpoints, sync master address;
    and `workers_ready()`, which waits for the workers it started (their endpoints filled in then)."""
    from ..core.rpc.address import reachable_host
    from ..core.rpc.security import read_token
    from ..core.rpc.server import ServerOptions
    from .run_service import start_run_server

    control = base.control
    ensure_token(control.token_env)
    token = read_token(control.token_env)
    assert token is not None
    queues = served_queues(stages)
    server, run = start_run_server(
        f"{base.project}/{base.name}",
        ServerOptions.from_control(control, token, port=control.run_port),
        heartbeat_interval_s=control.heartbeat_interval,
        serve_buffer=bool(queues),
        buffers={eb.name: eb for eb in queues.values()},
    )
    run_address = server.address
    print(f"rlcore: run controller (RunService) on {run_address}", flush=True)
    _leave_addresses(queues, run_address, token)
    workers: RolloutWorkers | None = None
    info: dict[str, Any] = {
        "run_address": run_address,
        "rollout_endpoints": [],
        "workers_managed": False,
        "master_address": "127.0.0.1",
    }
    try:
        started = workers_to_start(stages)
        joining = workers_to_join(stages)
        if worker_stages(stages):
            info["workers_managed"], workers = _workers(
                stages, started, joining, device, run_address, launch_dir, placement, keep_fds, worker_model
            )
            info["rollout_endpoints"] = list(worker_stages(stages)[0].explorer.rollout_model.endpoints)
            info["master_address"] = reachable_host(control.host)

        def workers_ready() -> None:
            """Wait until the started workers registered (their endpoints then in the plan), or raise."""
            if joining:
                ready = run.wait_for_workers("rollout", joining, control.worker_start_timeout, lambda: None)
            elif workers is not None and started is not None:
                ready = run.wait_for_workers(
                    "rollout", started[1], control.worker_start_timeout, workers.dead
                )
                workers.keep(run)
            else:
                return
            print(f"rlcore: rollout workers ready: {', '.join(ready)}", flush=True)
            info["rollout_endpoints"] = ready

        info["run"], info["workers_ready"] = run, workers_ready
        yield info
    finally:
        if workers is not None:
            workers.stop()
        server.stop(grace=1.0)
        for path in queues:  # the queue is gone with this process: nobody must find it
            for gone in (path, path.removesuffix(".address") + ".token"):
                if os.path.exists(gone):
                    os.remove(gone)


def served_queues(stages: list[Stage]) -> dict[str, Any]:
    """The buffer queues this launch serves (address file -> experience buffer config): those its
    mode-train RL stages read without a path (the explore launch finds them there)."""
    from ..buffer import address_file

    return {
        address_file(s.config): s.config.buffer.trainer_input.experience_buffer
        for s in stages
        if s.plan.source == "buffer"
        and s.config.buffer.trainer_input.experience_buffer.storage_type == "queue"
        and not s.config.buffer.trainer_input.experience_buffer.path
    }  # fmt: skip




def _leave_addresses(queues: dict[str, Any], run_address: str, token: str) -> None:
    """Write each served queue's address and token (mode 0600) where the explore launch finds them."""
    for path in queues:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        secret = path.removesuffix(".address") + ".token"
        with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(token)
        write_atomic(path, run_address)
        print(f"rlcore: experience buffer queue on {run_address} (address in {path})", flush=True)


def _workers(
    stages: list[Stage], started: tuple[Any, int] | None, joining: int, device: str, run_address: str,
    launch_dir: str, placement: GpuPlacement | None, keep_fds: tuple[int, ...], worker_model: Callable[[], str] | None,
) -> tuple[bool, RolloutWorkers | None]:  # fmt: skip
    """The rollout workers of a launch whose stages run on workers: (whether the launch keeps track
    of them, the ones it starts). Those on other hosts join; configured endpoints must answer."""
    control = stages[0].config.control
    if joining:
        print(
            f"rlcore: waiting for {joining} rollout worker(s) to join from their hosts: `rlcore rollout serve "
            f"--register <this host>:{control.run_port} ...` (control.worker_start_timeout "
            f"{control.worker_start_timeout:g} s)",
            flush=True,
        )
        return True, None
    if started is None:
        check_endpoints(list(worker_stages(stages)[0].explorer.rollout_model.endpoints), control)
        return False, None
    first, count = started
    where = "" if placement is None else " on GPU(s) " + "; ".join(",".join(g) for g in placement.engines)
    print(f"rlcore: starting {count} rollout worker(s){where} (logs in {launch_dir})", flush=True)
    workers = RolloutWorkers(
        first, worker_model or stages[0].config.model.model_path, count, device, run_address, launch_dir,
        gpus=None if placement is None else placement.engines, keep_fds=keep_fds,
    )  # fmt: skip
    return True, workers
