"""`rlcore trainer serve`: a trainer world (torchrun) whose rank 0 serves TrainerService and whose
other ranks run the commands rank 0 broadcasts, until shutdown.

    python -m rlcore.runtime.torchrun --standalone --nnodes 1 --nproc-per-node N \\
        -m rlcore.runtime.trainer_serve <options.json>

Across hosts every node runs `rlcore trainer serve` with the same --nnodes and --rdzv-endpoint and
its own --node-rank; their torchrun agents meet at the rendezvous on node 0. Rank 0, which serves,
is node 0's first rank wherever torchrun's rendezvous put it (`world_rank`): clients and rollout
workers reach the world at the address given to node 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from ..core.config import RLCoreConfig
from ..core.config.host_checks import check_nodes
from ..core.config.schema import ClusterConfig
from ..core.rpc.address import reachable_host
from ..core.rpc.cli import EXIT_USAGE, tls_from_args, usage_error, write_atomic
from ..core.rpc.security import TLSFiles, read_token
from ..core.rpc.server import MiB, RpcServer, ServerOptions, Service
from ..core.signals import StopSignals
from ..proto.v1 import trainer_pb2_grpc
from .child import wrap
from .fork_server import ForkServer, wanted
from .nodes import rank_entry, torchrun_args, watch_node
from .rank_entry import run_rank, sender_factory
from .trainer_service import SERVICE_NAME, TrainerServicer
from .trainer_world import Commander, TrainerWorld, exit_world

log = logging.getLogger("rlcore.trainer_serve")

_EXIT_INTERRUPTED = 130
_STOP_GRACE_S = 30.0
NODE_FLAGS = {
    "num_nodes": "--nnodes", "node_rank": "--node-rank", "rdzv_endpoint": "--rdzv-endpoint",
    "node_address": "--node-address",
}  # fmt: skip
"""The trainer nodes' settings as `rlcore trainer serve` spells them (errors name these)."""
RDZV_ID = "rlcore-trainer-serve"


def _sender_factory(token: str, tls: TLSFiles | None, max_message_bytes: int, device: str, host: str):
    """Rank 0's way to reach rollout workers: the run's token and TLS files, the trainer's limits;
    workers join the weight-sync group at the address this trainer serves on."""
    from ..client.base import ClientOptions

    def options(cfg: RLCoreConfig) -> ClientOptions:
        return ClientOptions(
            token=token, timeout=cfg.synchronizer.sync_timeout, max_message_bytes=max_message_bytes, tls=tls
        )

    return sender_factory(options, device, reachable_host(host))


def _serve_rank0(opts: dict[str, Any], commands: Any, signals: StopSignals) -> int:
    token = read_token(opts["token_env"])
    assert token is not None
    tls = (
        TLSFiles(opts["tls_cert"], opts["tls_key"], opts["tls_ca"], opts["tls_require_client_cert"])
        if opts["tls_cert"]
        else None
    )
    max_bytes = opts["max_message_mb"] * MiB
    world = TrainerWorld(opts["device"], _sender_factory(token, tls, max_bytes, opts["device"], opts["host"]))
    servicer = TrainerServicer(Commander(world, commands))
    try:
        options = ServerOptions(
            token=token, host=opts["host"], port=opts["port"], max_message_bytes=max_bytes, tls=tls
        )
        try:
            server = RpcServer(
                options,
                [Service(SERVICE_NAME, servicer, trainer_pb2_grpc.add_TrainerServiceServicer_to_server)],
            )
        except (OSError, ValueError, RuntimeError) as e:  # port taken (grpc raises RuntimeError), TLS files
            print(
                f"rlcore: error: cannot serve on {opts['host']}:{opts['port']}: {e}",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_USAGE
        nodes = f" on {opts['num_nodes']} nodes" if opts["num_nodes"] > 1 else ""
        print(
            f"rlcore: trainer serving on {server.address} ({dist.get_world_size()} rank(s){nodes}, {opts['device']})",
            flush=True,
        )
        if opts["port_file"]:
            write_atomic(opts["port_file"], server.address)
        signals.wait()
        server.stop(grace=5.0)
    finally:
        servicer.shutdown()
    return 0


def world_rank(opts: dict[str, Any]) -> int:
    """This process's rank: across hosts, node K's ranks are K * ranks + LOCAL_RANK (so rank 0, the
    one that serves, is node 0's first), not the order torchrun's rendezvous gave the nodes (it
    sorts them by address). Every node has the same number of ranks, so this is a permutation of
    torchrun's ranks, and the ranks of one node stay neighbours."""
    if opts["num_nodes"] == 1:
        return int(os.environ.get("RANK", 0))
    return int(opts["node_rank"]) * int(opts["ranks"]) + int(os.environ["LOCAL_RANK"])


def rank_main(options_path: str) -> int:
    with open(options_path) as f:
        opts = json.load(f)
    rank = world_rank(opts)
    os.environ["RANK"] = str(rank)  # what init_world's env:// rendezvous reads
    signals = StopSignals()  # polled by rank 0's server loop
    if rank == 0:  # rank 0 decides when the world ends; the others follow its shutdown broadcast
        signals.install()
        write_atomic(opts["pid_file"], str(os.getpid()))
    else:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    # torchrun's agent: a rank never outlives it (ranks > 0 ignore SIGTERM, rank 0 stops on it)
    return run_rank(
        rank, opts["device"], lambda commands: _serve_rank0(opts, commands, signals), log_level=logging.INFO,
        threads=opts["threads"], collective_timeout_s=opts["collective_timeout_s"], keep_serving=True,
        parent_signal=signal.SIGTERM if rank == 0 else signal.SIGKILL,
        joined=lambda: write_atomic(opts["joined_file"], str(rank)),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- `rlcore trainer serve`


def _checked(args: argparse.Namespace) -> ClusterConfig:
    """The trainer nodes the flags describe; ValueError names the first flag out of its range."""
    read_token(args.token_env)
    for flag, value, least in (
        ("--ranks", args.ranks, 1),
        ("--nnodes", args.nnodes, 1),
        ("--node-rank", args.node_rank, 0),
        ("--rdzv-timeout", args.rdzv_timeout, 1),
        ("--collective-timeout", args.collective_timeout, 1),
    ):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}; got {value}")
    cluster = ClusterConfig(
        num_nodes=args.nnodes, ranks_per_node=args.ranks, rdzv_endpoint=args.rdzv_endpoint,
        node_rank=args.node_rank, node_address=args.node_address, rdzv_timeout_s=args.rdzv_timeout,
    )  # fmt: skip
    check_nodes(cluster, NODE_FLAGS)
    tls_from_args(args)  # checked here; rank 0 builds the TLS files from the same flags
    return cluster


def _rank_options(args: argparse.Namespace, device: str, threads: int, workdir: str) -> dict[str, Any]:
    """What every rank reads (options.json in `workdir`)."""
    return {
        "device": device, "threads": threads, "host": args.host, "port": args.port,
        "port_file": os.path.abspath(args.port_file) if args.port_file else None,
        "token_env": args.token_env, "max_message_mb": args.max_message_mb,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_ca": args.tls_ca,
        "tls_require_client_cert": args.tls_require_client_cert,
        "pid_file": os.path.join(workdir, "rank0.pid"),
        "joined_file": os.path.join(workdir, "joined"),  # a rank of this node met the world: node 0 was there
        "num_nodes": args.nnodes, "node_rank": args.node_rank, "ranks": args.ranks,
        "collective_timeout_s": args.collective_timeout,
    }  # fmt: skip


def serve_main(args: argparse.Namespace) -> int:
    """Start the trainer world (torchrun) and wait for it; SIGTERM/Ctrl-C stop it through rank 0.
    Its torchrun and ranks are forked from a fork server where cluster.fork_server's default says so."""
    with ForkServer(wanted(SimpleNamespace(fork_server=ClusterConfig().fork_server, device=args.device))):
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    try:
        cluster = _checked(args)
    except ValueError as e:  # ConfigError too: the flags spell the keys
        return usage_error(str(e))
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        return usage_error("--device cuda but no CUDA device is visible; use --device cpu (or auto)")
    device = ("cuda" if cuda else "cpu") if args.device == "auto" else args.device
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.ranks)

    workdir = tempfile.mkdtemp(prefix="rlcore-trainer-")
    options = _rank_options(args, device, threads, workdir)
    options_path = os.path.join(workdir, "options.json")
    with open(options_path, "w") as f:
        json.dump(options, f)
    # torchrun as a child that dies with this process (child.py), even by kill -9
    cmd = wrap(os.getpid(), "rlcore.runtime.torchrun", *torchrun_args(cluster, RDZV_ID),
               *rank_entry("rlcore.runtime.trainer_serve", options_path))  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    if args.node_rank > 0:
        print(
            f"rlcore: trainer node {args.node_rank} of {args.nnodes}: {args.ranks} rank(s) on {device} meet node 0 "
            f"at {args.rdzv_endpoint}; node 0's rank 0 serves TrainerService",
            flush=True,
        )
    proc = subprocess.Popen(cmd, env=env)
    stops = StopSignals(at_once=True, signals=(signal.SIGTERM,)).install()  # Ctrl-C: Python's own
    try:
        if args.node_rank == 0:
            return proc.wait()
        # node 0 ends the world; a failure here is its or a link's
        rc, lost = _wait_node(proc, args, options["joined_file"])
        if rc == 0:
            print(f"rlcore: trainer node {args.node_rank}: the trainer world finished", flush=True)
            return 0
        why = lost or f"the trainer world exited with code {rc} (node 0 or this host's link went down?)"
        print(
            f"rlcore: error: trainer node {args.node_rank}: {why}; start every node's `rlcore trainer serve` again",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        rc = _stop_world(proc, options["pid_file"])
        if stops.received == signal.SIGTERM:  # asked to stop: rank 0's exit code is the world's
            return rc
        print("rlcore: interrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED
    finally:
        stops.restore()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_node(
    proc: subprocess.Popen, args: argparse.Namespace, joined_file: str, probe_s: float = 5.0
) -> tuple[int, str]:
    """Node K > 0: the world's exit code, and why this node ended it ("" if it ended by itself),
    watched (nodes.watch_node) by node 0's rendezvous accepting a connection, within
    --collective-timeout: a served world idles between a client's calls, so no heartbeat of the
    world's own says node 0 is there. A world this node's ranks joined (`joined_file`) had node 0 in
    it, though no probe may have reached it yet (a link cut right after the world formed)."""
    host, _, port = args.rdzv_endpoint.rpartition(":")
    heard = [0.0]

    def probe() -> float:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=probe_s).close()
            heard[0] = time.monotonic()
        except OSError:
            if not heard[0] and os.path.exists(joined_file):
                heard[0] = time.monotonic()
        return heard[0]

    return watch_node(
        proc, args.node_rank, probe, args.collective_timeout,
        lambda silent_s: (
            f"node 0's rendezvous {args.rdzv_endpoint} has not answered for {silent_s:.0f} s "
            "(--collective-timeout): node 0 or this host's link is down"
        ),
        poll_s=probe_s,
    )  # fmt: skip


def _stop_world(proc: subprocess.Popen, pid_file: str) -> int:
    """Ask rank 0 to shut the world down cleanly (its exit code is then the world's); if it is not
    up yet or does not finish in time, let torchrun terminate every rank."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
    try:
        with open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGTERM)
    except (OSError, ValueError):
        proc.terminate()
    try:
        return proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        return proc.wait()


if __name__ == "__main__":
    exit_world(rank_main(sys.argv[1]))
