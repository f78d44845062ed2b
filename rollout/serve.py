"""`rlcore rollout serve`: load an engine, serve RolloutService until SIGINT/SIGTERM, optionally
joining a run (RegisterWorker, then heartbeats)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from ..core.config.dtypes import compute_dtype
from ..core.rpc.cli import tls_from_args, usage_error, write_atomic
from ..core.rpc.security import read_token
from ..core.rpc.server import MiB, RpcServer, ServerOptions
from ..core.signals import StopSignals
from .engines.spec import EngineSpec
from .http_door import HttpDoor
from .loopback_door import workflow_context
from .server import RolloutServicer, rollout_service

log = logging.getLogger("rlcore.rollout.serve")

SHUTDOWN_S = 10.0
"""How long a stopping worker may take to close its server and engine before it exits regardless."""


def _exit_within(seconds: float) -> None:
    """Exit the process `seconds` from now unless it has ended by then: a generation or weight receive
    still running in a thread (which nothing can interrupt) must not keep a stopped worker alive, as
    when the launcher was killed and nobody waits for the results any more."""

    def force() -> None:
        print(f"rlcore: the rollout worker did not shut down within {seconds:g} s; exiting now", flush=True)
        os._exit(0)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()


def _heartbeat_loop(
    run: Any, address: str, index: int, interval_s: float, servicer: RolloutServicer, stop: threading.Event
) -> None:
    """Heartbeat to the run every `interval_s`. A controller that no longer knows this worker was
    started again (a launch resumed after its controller was lost): the worker registers with it
    again, and the resumed run takes it back."""
    from ..client.base import RpcError

    while not stop.wait(interval_s):
        try:
            run.heartbeat(servicer.worker_id, policy_version=servicer.engine.policy_version)
        except RpcError as e:
            if e.code.name != "INVALID_ARGUMENT":  # unreachable, or not up yet: try on
                log.warning("heartbeat to the run at %s failed: %s", run.address, e)
                continue
            try:
                servicer.worker_id, _ = run.register_worker("rollout", address, index)
                print(
                    f"rlcore: the run at {run.address} started again; joined it as {servicer.worker_id}",
                    flush=True,
                )
            except RpcError as again:
                log.warning("registering again with the run at %s failed: %s", run.address, again)


def start_http_door(servicer: RolloutServicer, token: str, args: argparse.Namespace) -> HttpDoor:
    try:
        from .openai_app import build_app
        from .openai_door import OpenAIDoor
    except ImportError as e:
        raise OSError(f"--http-port needs FastAPI and uvicorn ({e}): pip install 'rlcore[http]'") from None

    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    door = HttpDoor(
        build_app(
            OpenAIDoor(
                servicer,
                servicer.episodes,
                token,
                name,
                args.http_max_n,
                args.http_max_request_tokens,
                args.http_batch_wait_ms / 1000,
                args.tool_call_format,
            )
        ),
        args.host,
        args.http_port,
        name,
    )
    if args.http_port_file:
        write_atomic(args.http_port_file, door.address)
    return door


def _bad_flag(args: argparse.Namespace) -> str | None:
    """The first flag out of its range, said in one line (None: all in range)."""
    if args.http_port is not None and not 0 <= args.http_port <= 65535:
        return f"--http-port must be a port number (0 to 65535, 0: any free one); got {args.http_port}"
    for name in ("max_model_len", "max_batch_size", "max_message_mb", "tensor_parallel_size", "http_max_n",
                 "http_max_request_tokens", "max_lora_rank"):  # fmt: skip
        if getattr(args, name) is not None and getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}"
    if not 0 <= args.http_batch_wait_ms <= 1000:
        return f"--http-batch-wait-ms must be in [0, 1000]; got {args.http_batch_wait_ms}"
    if args.max_loras is not None and args.max_loras < 0:
        return f"--max-loras must be >= 0; got {args.max_loras}"
    if args.engine_spec and (args.max_loras is not None or args.max_lora_rank is not None):
        return "--max-loras and --max-lora-rank: a launch's --engine-spec sets the engine (engine_options.max_loras)"
    for module in args.lora_modules:
        name, eq, path = module.partition("=")
        if not (eq and name and path):
            return f"--lora-modules: give NAME=PATH (an adapter's name and its peft folder); got '{module}'"
    return None


def _join_run(
    run: Any, address: str, index: int, servicer: Any, stop: threading.Event, wait_s: float = 0.0
) -> None:
    """Register with the run (--register), waiting up to `wait_s` for its controller to come up (the
    launch may start after its workers), and keep sending heartbeats until `stop`."""
    worker_id, interval_s = _register_first(run, address, index, wait_s)
    servicer.worker_id = worker_id
    if interval_s > 0:
        threading.Thread(
            target=_heartbeat_loop, args=(run, address, index, interval_s, servicer, stop), name="heartbeat",
            daemon=True,
        ).start()  # fmt: skip


def _register_first(run: Any, address: str, index: int, wait_s: float) -> tuple[str, float]:
    """The first RegisterWorker, retried while the controller is not there yet (UNAVAILABLE: nothing
    listens at its address) until `wait_s` has passed; any other failure at once."""
    import grpc

    from ..client.base import RpcError

    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return run.register_worker("rollout", address, index)
        except RpcError as e:
            if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise
            if not said:
                print(f"rlcore: waiting for the run at {run.address} to answer (--register-timeout {wait_s:.0f} s)",
                      flush=True)  # fmt: skip
                said = True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _log_rlcore_records() -> None:
    """rlcore's records from INFO on to stderr (the worker's log: the launch writes it to
    launch/rollout_worker_<i>.log), as the explorer and the trainer ranks log theirs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[worker] %(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    rlcore_log = logging.getLogger("rlcore")
    rlcore_log.addHandler(handler)
    rlcore_log.setLevel(logging.INFO)


def _engine(args: argparse.Namespace) -> Any:
    """The engine --engine-spec (a launch's) or the engine flags ask for, holding the --lora-modules
    adapters; ValueError says in one line why it cannot load."""
    import torch

    from .engines import build_engine
    from .engines.base import resolve_max_model_len

    if os.path.isabs(args.model) and not os.path.isdir(args.model):  # else HF reads it as a repo id
        raise ValueError(f"--model {args.model}: no such folder; give an HF model folder or a hub id")
    spec = _engine_spec(args)
    try:
        max_model_len = resolve_max_model_len(args.model, spec.max_model_len, "--max-model-len")
    except OSError as e:
        raise ValueError(f"--model {args.model}: {e}") from None
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = spec.device if spec.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    spec = replace(spec, device=device, dtype=compute_dtype(spec.dtype, device), max_model_len=max_model_len)
    try:
        engine = build_engine(spec)
    except (OSError, ValueError, ImportError) as e:
        raise ValueError(f"cannot load --model {args.model} with the {spec.engine_type} engine: {e}") from None
    for module in args.lora_modules:  # NAME=PATH (checked by _bad_flag)
        name, _, path = module.partition("=")
        try:
            engine.load_adapter(name, path)
        except ValueError as e:
            engine.close()
            raise ValueError(f"--lora-modules {module}: {e}") from None
    return engine


def _engine_spec(args: argparse.Namespace) -> EngineSpec:
    """--engine-spec with --model's folder, or the spec the engine flags make (args.engine becomes
    the spec's engine, which the worker reports)."""
    if args.engine_spec:
        spec = EngineSpec.from_json(args.engine_spec).with_model(args.model)
        args.engine = spec.engine_type
        return spec
    options = {
        "tensor_parallel_size": args.tensor_parallel_size, "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": args.enforce_eager, "seed": args.seed, "service_url": args.service_url,
        "service_model": args.service_model, "service_key_env": args.service_key_env,
    }  # fmt: skip
    own = {name: getattr(args, name) for name in ("max_loras", "max_lora_rank") if getattr(args, name) is not None}
    return EngineSpec(
        args.engine, args.model, args.device, args.dtype, args.max_model_len, args.max_batch_size, options, own
    )


def serve_main(args: argparse.Namespace) -> int:
    """`rlcore rollout serve`: load the engine, serve until SIGINT/SIGTERM; returns the exit code."""
    try:
        token = read_token(args.token_env)
        tls = tls_from_args(args)
    except ValueError as e:
        return usage_error(str(e))
    assert token is not None  # required
    if (problem := _bad_flag(args)) is not None:
        return usage_error(problem)

    try:
        engine = _engine(args)
    except ValueError as e:
        return usage_error(str(e))
    if args.partial_rollout and not engine.interruptible:
        engine.close()
        return usage_error(
            f"--partial-rollout: the {args.engine} engine cannot interrupt its calls; use --engine hf or vllm"
        )
    options = ServerOptions(
        token=token, host=args.host, port=args.port, max_message_bytes=args.max_message_mb * MiB, tls=tls
    )
    servicer = RolloutServicer(
        engine, engine_name=args.engine, model_path=args.model, max_message_bytes=options.max_message_bytes,
        partial_rollout=args.partial_rollout, workflow_context=workflow_context(),
    )  # fmt: skip
    _log_rlcore_records()
    try:
        server = RpcServer(options, [rollout_service(servicer)])
    except OSError as e:
        return usage_error(str(e))

    stop = threading.Event()
    signals = StopSignals().install()  # polled below; the handlers go back in the finally
    run = None
    http: HttpDoor | None = None
    try:
        if args.port_file:
            write_atomic(args.port_file, server.address)
        if args.register:
            from ..client.base import ClientOptions, RpcError
            from ..client.run import RunClient

            run = RunClient(args.register, ClientOptions(token=token, timeout=30.0, tls=tls))
            try:
                _join_run(run, server.address, args.index, servicer, stop, args.register_timeout)
            except RpcError as e:
                return usage_error(
                    f"cannot register with the run at {args.register}: {e}; is its launch running there "
                    "(control.host, control.run_port)? --register-timeout waits longer for it to start"
                )
        print(f"rlcore: rollout worker serving {args.model} on {server.address}", flush=True)
        if args.http_port is not None:
            try:
                http = start_http_door(servicer, token, args)
            except OSError as e:
                return usage_error(str(e))
            except ValueError as e:  # --tool-call-format response_template without one
                return usage_error(str(e).replace("tool_call_format", "--tool-call-format"))
            print(
                f"rlcore: OpenAI-compatible API on http://{http.address}/v1 (model '{http.model_name}')",
                flush=True,
            )
        signals.wait()
    finally:
        stop.set()
        _exit_within(SHUTDOWN_S)
        if http is not None:
            http.stop()
        server.stop()
        if run is not None:
            run.close()
        engine.close()
        signals.restore()
    return 0
