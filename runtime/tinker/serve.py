"""`rlcore tinker serve`: the Tinker API (what the official `tinker` SDK calls) over an rlcore
trainer world and a sampling engine.

    rlcore tinker serve --base-model rlcore/tiny=/models/tiny --port 8000      # key in $TINKER_API_KEY
    python -c "import tinker; tinker.ServiceClient(base_url='http://127.0.0.1:8000', api_key='tml-...')"

The trainer world is `rlcore trainer serve`, started as a child of this process (its own token,
its port in the work folder) unless --trainer names a running one. The sampler (rlcore's HF engine)
runs in this process.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time

from ...core.rpc.cli import EXIT_USAGE, await_port_file, usage_error, write_atomic
from ...core.signals import StopSignals
from ..child import wrap
from .access import keys_of

TRAINER_TOKEN_ENV = "RLCORE_TINKER_TRAINER_TOKEN"
"""The child trainer world's token (a fresh random one; only this process talks to it)."""
START_TIMEOUT_S = 300.0


def _base_models(values: list[str]) -> dict[str, str]:
    models = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = os.path.basename(os.path.normpath(value)), value
        path = os.path.abspath(path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"--base-model {value}: {path} has no config.json (an HF model folder is needed)")
        models[name] = path
    return models


def _start_trainer(args: argparse.Namespace, device: str, workdir: str) -> tuple[subprocess.Popen | None, str, str]:
    """(child process or None, address, token) of the trainer world."""
    if args.trainer:
        token = os.environ.get(args.trainer_token_env, "") if args.trainer_token_env else ""
        return None, args.trainer, token
    token = secrets.token_hex(16)
    port_file = os.path.join(workdir, "trainer.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    log_path = os.path.join(workdir, "trainer.log")
    cmd = wrap(os.getpid(), "rlcore.cli", "trainer", "serve", "--ranks", str(args.ranks), "--device", device,
               "--threads", str(args.threads), "--port", "0", "--port-file", port_file,
               "--token-env", TRAINER_TOKEN_ENV)  # fmt: skip
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, TRAINER_TOKEN_ENV: token}, stdout=log, stderr=subprocess.STDOUT)
    return proc, await_port_file(port_file, proc, START_TIMEOUT_S, f"the trainer world (log: {log_path})"), token


def serve_main(args: argparse.Namespace) -> int:
    try:
        from .app import build_app
    except ImportError as e:
        return usage_error(f"rlcore tinker serve needs the tinker SDK, FastAPI and uvicorn ({e}): "
                           "pip install 'rlcore[tinker]'")  # fmt: skip
    from ...client.base import ClientOptions
    from ...client.trainer import TrainerClient
    from ...core.config.dtypes import compute_dtype
    from ...rollout.http_door import HttpDoor
    from .service import TinkerService

    keys = keys_of(os.environ.get(args.api_key_env, ""))
    if not keys:
        return usage_error(f"--api-key-env: ${args.api_key_env} is empty; set the key clients will send "
                           "(e.g. export TINKER_API_KEY=tml-$(openssl rand -hex 16))")  # fmt: skip
    try:
        models = _base_models(args.base_model)
    except ValueError as e:
        return usage_error(str(e))
    for flag, value in (("--keep-samplers", args.keep_samplers), ("--max-models", args.max_models)):
        if value < 1:
            return usage_error(f"{flag}: must be >= 1; got {value}")
    if args.max_model_mb < 0:
        return usage_error(f"--max-model-mb: must be >= 0 (0: no limit); got {args.max_model_mb}")
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = compute_dtype(args.dtype, device)
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    proc, address, token = _start_trainer(args, device, workdir)
    trainer = TrainerClient(address, ClientOptions(token=token or None, timeout=3600))
    service = TinkerService(
        trainer, models, workdir, device, dtype, args.max_model_len, args.strategy, args.keep_samplers,
        args.max_models, args.max_model_mb,
    )
    listed = [{"model_name": n, "max_context_length": args.max_model_len, "trainable": True, "sampleable": True}
              for n in models]  # fmt: skip
    try:
        door = HttpDoor(build_app(service, keys, listed), args.host, args.port, "tinker")
    except OSError as e:
        if proc is not None:
            proc.terminate()
        print(f"rlcore: error: cannot serve on {args.host}:{args.port}: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"rlcore: Tinker API on http://{door.address} ({', '.join(models)}; trainer world at {address}, "
          f"{args.strategy} on {device})", flush=True)  # fmt: skip
    if args.port_file:
        write_atomic(args.port_file, door.address)
    # SIGTERM: a flag this loop polls (core/signals.py), kept through the shutdown below so that a
    # second one is recorded, not fatal; Ctrl-C: KeyboardInterrupt
    signals = StopSignals(signals=(signal.SIGTERM,)).install()
    try:
        while signals.received is None and (proc is None or proc.poll() is None):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    door.stop()
    service.close()
    trainer.close()
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    elif proc is not None:
        print(f"rlcore: error: the trainer world ended (exit code {proc.returncode}); see {workdir}/trainer.log",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0
