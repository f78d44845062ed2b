"""The trainer as a remote training API: `rlcore trainer serve` starts a trainer world whose rank 0
serves TrainerService (proto/rlcore/v1/trainer.proto).

Every rank holds the same `TrainerWorld` and must run the same collectives in the same order, so
rank 0 serves one call at a time: it validates the request completely (a bad request never reaches
the other ranks), broadcasts (command, payload) to them, runs the command itself and answers. The
other ranks do nothing but receive commands and run them until "shutdown".

    python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node N \\
        -m rlcore.core.trainer_service <options.json>
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..proto.v1 import trainer_pb2, trainer_pb2_grpc
from .checkpoint import TRAINER_STATE, TrainerState, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import ConfigError, RLCoreConfig, Stage, from_yaml
from .config.validate import validate_config
from .rpc.convert import experience_from_proto
from .rpc.errors import FailedPrecondition, InvalidArgument, Unavailable, require
from .rpc.security import TLSFiles, read_token
from .rpc.server import MiB, RpcServer, ServerOptions, Service
from .types import Experience

if TYPE_CHECKING:
    from .trainer import StageTrainer

log = logging.getLogger("rlcore.trainer_service")

LOSSES = ("grpo", "ppo", "cross_entropy")
POLICY_LOSSES = ("grpo", "ppo")
SERVICE_NAME = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name
# Ranks > 0 wait for the next command in a broadcast for as long as no client calls: that group's
# timeout has to outlast idle time. It is a gloo group, so idle ranks block on the CPU (never in a
# spinning NCCL kernel), and the default group keeps its usual timeout for the work itself.
IDLE_TIMEOUT = datetime.timedelta(days=7)
_EXIT_USAGE, _EXIT_INTERRUPTED = 2, 130
_STOP_GRACE_S = 30.0


# ---------------------------------------------------------------------------------------------- calls
# What rank 0 broadcasts: validated, plain Python (pickled by broadcast_object_list).


@dataclass
class ConfigureCall:
    cfg: RLCoreConfig
    model_path: str
    checkpoint_dir: str
    total_steps: int


@dataclass
class SequenceSpec:
    """One validated TrainSequence; per-token lists have the response's length."""

    prompt: list[int]
    response: list[int]
    loss_mask: list[float]
    advantages: list[float]
    old_logprobs: list[float] | None


@dataclass
class ForwardBackwardCall:
    sequences: list[SequenceSpec]
    loss: str
    temperature: float
    normalize_tokens: float


# ---------------------------------------------------------------------------------------------- every rank


class TrainerWorld:
    """The training side as every rank holds it; rank 0's servicer and the other ranks' command
    loop call the same methods with the same arguments in the same order."""

    def __init__(self, device: str, make_sender: Callable[[list[str], RLCoreConfig], Any] | None = None):
        self.device = device
        self.trainer: StageTrainer | None = None
        self.model_path = ""
        self.vocab_size = 0
        self._make_sender = make_sender  # rank 0 only: WeightSender for a list of endpoints
        self._senders: dict[tuple[str, ...], Any] = {}

    def _t(self) -> StageTrainer:
        assert self.trainer is not None, "rank 0 checks Configure before broadcasting"
        return self.trainer

    def configure(self, call: ConfigureCall) -> dict[str, Any]:
        from .trainer import StageTrainer

        self.trainer = None  # free the previous model and optimizer before building the next
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.trainer = StageTrainer(
            Stage(0, "remote", call.cfg), call.checkpoint_dir, call.model_path, self.device,
            export_final_hf=False, with_explorer=False, total_train_steps=call.total_steps,
        )  # fmt: skip
        self.model_path = call.model_path
        self.vocab_size = int(self.trainer.strategy.hf_config().vocab_size)
        model = self.trainer.strategy.model  # DTensor parameters report their global size
        return {
            "strategy": call.cfg.trainer.strategy,
            "world_size": dist.get_world_size(),
            "num_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        }

    def forward_backward(self, call: ForwardBackwardCall) -> dict[str, Any]:
        from .algorithms import LossNorm, build_loss
        from .batch import Sequence

        t = self._t()
        seqs = [Sequence(s.prompt, s.response, s.old_logprobs, index=i) for i, s in enumerate(call.sequences)]
        mbs, rows = t._micro(seqs)
        for mb, idx in zip(mbs, rows, strict=True):
            for r, i in enumerate(idx):  # the batch's right-padded layout: response at [p, p + n)
                s = call.sequences[i]
                p, n = len(s.prompt), len(s.response)
                mask = torch.tensor(s.loss_mask, dtype=torch.float32)
                mb["loss_mask"][r, p : p + n] = mask
                mb["advantages"][r, p : p + n] = mask * torch.tensor(s.advantages, dtype=torch.float32)
        algo = t.cfg.algorithm
        if call.loss == "cross_entropy":
            algo = dataclasses.replace(algo, algorithm_type="sft")
        else:  # the KL term needs the reference model, which only an RL config builds
            algo = dataclasses.replace(
                algo, algorithm_type="grpo", kl_loss_fn=algo.kl_loss_fn if t.needs_ref else "none"
            )
        num_tokens = sum(sum(s.loss_mask) for s in call.sequences)
        norm = LossNorm(
            num_tokens=call.normalize_tokens or num_tokens,
            num_seqs=float(sum(1 for s in call.sequences if sum(s.loss_mask) > 0)),
            max_response_len=t.max_response_len,
        )
        loss_fn = build_loss(algo, norm)
        if loss_fn.needs_reference:
            ref = t.strategy.compute_logprobs(mbs, call.temperature, reference=True)
            for mb, lp in zip(mbs, ref, strict=True):
                mb["ref_logprobs"] = lp
        metrics = t.strategy.forward_backward(mbs, loss_fn, call.temperature)
        loss = metrics["sft/loss"] if call.loss == "cross_entropy" else metrics["actor/loss"]
        return {"loss": loss, "metrics": metrics, "num_tokens": int(round(num_tokens))}

    def optim_step(self, _: None) -> dict[str, Any]:
        t = self._t()
        lr = t.strategy.current_lr()  # the scheduler moves on inside optimizer_step
        grad_norm = t.strategy.optimizer_step()
        t.state.global_step += 1
        return {"grad_norm": grad_norm, "lr": lr, "global_step": t.state.global_step}

    def train_step(self, exps: list[Experience]) -> dict[str, Any]:
        t = self._t()
        metrics = t.train_experiences(exps)
        return {"metrics": metrics, "global_step": t.state.global_step}

    def save_checkpoint(self, call: tuple[bool, int]) -> dict[str, str]:
        from .hf_export import export_hf

        t = self._t()
        with_hf, explore_step = call
        t.state.explore_step = explore_step
        t.state.kl_ctrl = t.kl_ctrl.state_dict()
        export = None
        if with_hf:

            def export(path: str) -> None:
                weights = t.strategy.iter_full_weights()
                export_hf(weights, path, t.strategy.hf_config(), t.model_path, write=dist.get_rank() == 0)

        path = save_checkpoint(
            t.stage_dir, t.strategy, t.state, t.cfg.trainer.max_checkpoints_to_keep, export
        )
        return {"path": path, "hf_path": os.path.join(path, "hf") if with_hf else ""}

    def load_checkpoint(self, path: str) -> TrainerState:
        t = self._t()
        t.state = load_checkpoint(path, t.strategy)
        t.kl_ctrl.load_state_dict(t.state.kl_ctrl)
        return t.state

    def sync_weights(self, endpoints: list[str]) -> dict[str, Any]:
        """Rank 0 sends over a weight-sync group with the workers; the other ranks only take part in
        the strategy's gathers. Workers accept only increasing versions, so the version announced is
        the global step, or one past what they serve when that is not newer (a step-0 sync, a resync)."""
        from .weight_sync import spec_of

        t = self._t()
        weights = t.strategy.iter_full_weights()
        if self._make_sender is None:  # ranks > 0; rank 0 keeps the version (it writes trainer state)
            for _ in weights:  # collective: every rank walks the iterator
                pass
            return {}
        start = time.perf_counter()
        key = tuple(endpoints)
        try:
            if key not in self._senders:
                self._senders[key] = self._make_sender(endpoints, t.cfg)
            sender = self._senders[key]
            served = max(c.get_info().policy_version for c in sender.clients)
            version = max(t.state.global_step, served + 1)
            specs = [spec_of(*s) for s in t.strategy.weight_specs()]
            stats = sender.send(specs, weights, version)
        except Exception:
            sender = self._senders.pop(key, None)
            if sender is not None:  # its group may be broken; the next call forms a new one
                sender.close()
            raise
        finally:
            for _ in weights:  # collective: the other ranks walk it to the end whatever happened here
                pass
        t.state.policy_version = version
        return {
            "policy_version": version,
            "num_bytes": int(stats["num_bytes"]),
            "seconds": time.perf_counter() - start,
        }


# ---------------------------------------------------------------------------------------------- validation


def _check_ids(ids: list[int], vocab_size: int, field: str) -> None:
    bad = next((x for x in ids if not 0 <= x < vocab_size), None)
    require(bad is None, field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def _check_finite(values: list[float], field: str) -> None:
    require(all(math.isfinite(v) for v in values), field, "values must be finite")


def validate_sequence(
    msg: trainer_pb2.TrainSequence, field: str, loss: str, vocab_size: int, max_model_len: int
) -> SequenceSpec:
    """Check one TrainSequence against the model and the loss; expand per-sequence values."""
    prompt, response = list(msg.prompt_token_ids), list(msg.response_token_ids)
    n = len(response)
    require(n > 0, f"{field}.response_token_ids", "must be non-empty")
    require(
        len(prompt) + n <= max_model_len,
        field,
        f"prompt + response is {len(prompt) + n} tokens; model.max_model_len is {max_model_len}",
    )
    _check_ids(prompt, vocab_size, f"{field}.prompt_token_ids")
    _check_ids(response, vocab_size, f"{field}.response_token_ids")
    mask = list(msg.loss_mask) or [1.0] * n
    require(len(mask) == n, f"{field}.loss_mask", f"has {len(mask)} values for {n} response tokens")
    require(all(0.0 <= v <= 1.0 for v in mask), f"{field}.loss_mask", "values must be in [0, 1]")
    if not prompt:
        mask[0] = 0.0  # nothing precedes the first token, so nothing predicts it
    advantages, old = list(msg.advantages), list(msg.old_logprobs)
    policy = loss in POLICY_LOSSES
    if advantages or policy:
        require(
            len(advantages) in (1, n),
            f"{field}.advantages",
            f"needs 1 value or {n} (one per response token) for loss {loss}; got {len(advantages)}",
        )
        _check_finite(advantages, f"{field}.advantages")
    if old or policy:
        require(len(old) == n, f"{field}.old_logprobs", f"has {len(old)} values for {n} response tokens")
        _check_finite(old, f"{field}.old_logprobs")
    if len(advantages) == 1:
        advantages = advantages * n
    return SequenceSpec(prompt, response, mask, advantages or [0.0] * n, old if policy else None)


def validate_forward_backward(
    request: trainer_pb2.ForwardBackwardRequest, vocab_size: int, max_model_len: int
) -> ForwardBackwardCall:
    require(request.loss in LOSSES, "loss", f"must be one of {', '.join(LOSSES)}; got '{request.loss}'")
    require(len(request.sequences) > 0, "sequences", "must be non-empty")
    temperature = request.temperature or 1.0
    require(math.isfinite(temperature) and temperature > 0, "temperature", f"must be > 0; got {temperature}")
    norm = request.normalize_tokens
    require(math.isfinite(norm) and norm >= 0, "normalize_tokens", f"must be >= 0; got {norm}")
    seqs = [
        validate_sequence(s, f"sequences[{i}]", request.loss, vocab_size, max_model_len)
        for i, s in enumerate(request.sequences)
    ]
    require(any(sum(s.loss_mask) > 0 for s in seqs), "sequences", "no response token has loss_mask > 0")
    return ForwardBackwardCall(seqs, request.loss, temperature, norm)


def validate_configure(request: trainer_pb2.ConfigureRequest) -> ConfigureCall:
    require(bool(request.config_yaml.strip()), "config_yaml", "must be a non-empty rlcore config")
    require(request.total_steps >= 1, "total_steps", f"must be >= 1; got {request.total_steps}")
    try:
        cfg = from_yaml(request.config_yaml)
        validate_config(cfg, check_paths=False)
    except ConfigError as e:
        raise InvalidArgument("config_yaml", str(e)) from None
    except Exception as e:  # malformed YAML, keys the schema lacks, wrong types (yaml/OmegaConf errors)
        raise InvalidArgument("config_yaml", " ".join(str(e).split()) or type(e).__name__) from None
    field = "model_path" if request.model_path else "config_yaml"
    model_path = os.path.abspath(request.model_path or cfg.model.model_path)
    require(
        os.path.isfile(os.path.join(model_path, "config.json")),
        field,
        f"'{model_path}' has no config.json (an HF model folder on the trainer's machine is needed)",
    )
    ckpt = request.checkpoint_dir or os.path.join(cfg.checkpoint_root_dir, cfg.project, cfg.name)
    return ConfigureCall(cfg, model_path, os.path.abspath(ckpt), int(request.total_steps))


def validate_experiences(
    request: trainer_pb2.TrainStepRequest, vocab_size: int, max_model_len: int
) -> list[Experience]:
    require(len(request.experiences) > 0, "experiences", "must be non-empty")
    exps = []
    for i, msg in enumerate(request.experiences):
        field = f"experiences[{i}]"
        e = experience_from_proto(msg, field)
        total = len(e.prompt_token_ids) + len(e.response_token_ids)
        require(
            total <= max_model_len,
            field,
            f"prompt + response is {total} tokens; model.max_model_len is {max_model_len}",
        )
        _check_ids(e.prompt_token_ids, vocab_size, f"{field}.prompt_token_ids")
        _check_ids(e.response_token_ids, vocab_size, f"{field}.response_token_ids")
        _check_finite(e.logprobs, f"{field}.logprobs")
        exps.append(e)
    return exps


def _check_checkpoint(path: str, world_size: int) -> None:
    require(os.path.isfile(os.path.join(path, TRAINER_STATE)), "path", f"'{path}' is not a checkpoint folder")
    missing = [r for r in range(world_size) if not os.path.isfile(os.path.join(path, f"rng_rank{r}.pt"))]
    require(
        not missing,
        "path",
        f"'{path}' was written by fewer trainer ranks than the {world_size} serving now; restart with as many",
    )


# ---------------------------------------------------------------------------------------------- rank 0


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """TrainerService on rank 0: validate, broadcast the command, run it here, answer."""

    def __init__(self, world: TrainerWorld, commands: Any):
        self.world = world
        self._commands = commands  # the gloo group commands travel on
        self._lock = threading.Lock()
        self._closed = False

    def _run(self, command: str, payload: Any) -> Any:
        """Run `command` on every rank; the caller holds the lock and has validated `payload`."""
        if self._closed:
            raise Unavailable("the trainer is shutting down")
        dist.broadcast_object_list([command, payload], src=0, group=self._commands)
        return getattr(self.world, command)(payload)

    def _configured(self) -> StageTrainer:
        if self.world.trainer is None:
            raise FailedPrecondition("call Configure first")
        return self.world.trainer

    def shutdown(self) -> None:
        """Release the other ranks from their command loop (once)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                dist.broadcast_object_list(["shutdown", None], src=0, group=self._commands)

    def Configure(self, request, context):
        call = validate_configure(request)
        with self._lock:
            out = self._run("configure", call)
        return trainer_pb2.ConfigureResponse(**out)

    def ForwardBackward(self, request, context):
        with self._lock:
            t = self._configured()
            call = validate_forward_backward(request, self.world.vocab_size, t.cfg.model.max_model_len)
            out = self._run("forward_backward", call)
        return trainer_pb2.ForwardBackwardResponse(**out)

    def OptimStep(self, request, context):
        with self._lock:
            self._configured()
            out = self._run("optim_step", None)
        return trainer_pb2.OptimStepResponse(**out)

    def TrainStep(self, request, context):
        with self._lock:
            t = self._configured()
            if t.is_sft:
                raise FailedPrecondition(
                    "TrainStep runs an RL step; Configure with algorithm.algorithm_type grpo "
                    "(or train SFT with ForwardBackward(loss=cross_entropy) + OptimStep)"
                )
            exps = validate_experiences(request, self.world.vocab_size, t.cfg.model.max_model_len)
            out = self._run("train_step", exps)
        return trainer_pb2.TrainStepResponse(**out)

    def SaveCheckpoint(self, request, context):
        require(request.explore_step >= 0, "explore_step", f"must be >= 0; got {request.explore_step}")
        with self._lock:
            self._configured()
            out = self._run("save_checkpoint", (request.export_hf, int(request.explore_step)))
        return trainer_pb2.SaveCheckpointResponse(**out)

    def LoadCheckpoint(self, request, context):
        with self._lock:
            t = self._configured()
            path = os.path.abspath(request.path) if request.path else latest_checkpoint(t.stage_dir)
            if path is None:
                return trainer_pb2.LoadCheckpointResponse()
            _check_checkpoint(path, t.world)
            state = self._run("load_checkpoint", path)
        return trainer_pb2.LoadCheckpointResponse(
            path=path, global_step=state.global_step, explore_step=state.explore_step
        )

    def GetState(self, request, context):
        t = self.world.trainer  # read without the lock: a long TrainStep must not block status calls
        if t is None:
            return trainer_pb2.GetStateResponse(configured=False, world_size=dist.get_world_size())
        return trainer_pb2.GetStateResponse(
            configured=True, global_step=t.state.global_step, policy_version=t.state.policy_version,
            strategy=t.cfg.trainer.strategy, world_size=t.world, model_path=self.world.model_path,
        )  # fmt: skip

    def SyncWeights(self, request, context):
        endpoints = list(request.endpoints)
        require(len(endpoints) > 0, "endpoints", "must be non-empty")
        for i, e in enumerate(endpoints):
            host, sep, port = e.rpartition(":")
            require(bool(host and sep and port.isdigit()), f"endpoints[{i}]", f"must be host:port; got '{e}'")
        require(len(set(endpoints)) == len(endpoints), "endpoints", "lists a worker more than once")
        with self._lock:
            self._configured()
            out = self._run("sync_weights", endpoints)
        return trainer_pb2.SyncWeightsResponse(**out)


def _sender_factory(token: str, tls: TLSFiles | None, max_message_bytes: int, device: str, host: str):
    """Rank 0's way to reach rollout workers: the run's token and TLS files, the trainer's limits;
    workers join the weight-sync group at the address this trainer serves on."""
    master_address = socket.gethostname() if host in ("0.0.0.0", "::", "[::]") else host

    def make(endpoints: list[str], cfg: RLCoreConfig) -> Any:
        from ..client.base import ClientOptions
        from ..client.rollout import RolloutClient
        from .weight_sync import WeightSender

        sc = cfg.synchronizer
        options = ClientOptions(
            token=token, timeout=sc.sync_timeout, max_message_bytes=max_message_bytes, tls=tls
        )
        return WeightSender(
            [RolloutClient(e, options) for e in endpoints],
            backend="nccl" if device == "cuda" else "gloo",
            timeout_s=sc.sync_timeout,
            bucket_bytes=sc.bucket_mb * MiB,
            master_address=master_address,
        )

    return make


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _serve_rank0(opts: dict[str, Any], commands: Any, stop: threading.Event) -> int:
    token = read_token(opts["token_env"])
    assert token is not None
    tls = (
        TLSFiles(opts["tls_cert"], opts["tls_key"], opts["tls_ca"], opts["tls_require_client_cert"])
        if opts["tls_cert"]
        else None
    )
    max_bytes = opts["max_message_mb"] * MiB
    world = TrainerWorld(opts["device"], _sender_factory(token, tls, max_bytes, opts["device"], opts["host"]))
    servicer = TrainerServicer(world, commands)
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
            return _EXIT_USAGE
        print(
            f"rlcore: trainer serving on {server.address} ({dist.get_world_size()} rank(s), {opts['device']})",
            flush=True,
        )
        if opts["port_file"]:
            _write_atomic(opts["port_file"], server.address)
        while not stop.wait(1.0):
            pass
        server.stop(grace=5.0)
    finally:
        servicer.shutdown()
    return 0


def _command_loop(world: TrainerWorld, commands: Any) -> None:
    """Ranks > 0: run what rank 0 broadcasts until it says shutdown."""
    while True:
        box: list[Any] = [None, None]
        dist.broadcast_object_list(box, src=0, group=commands)
        command, payload = box
        if command == "shutdown":
            return
        try:
            getattr(world, command)(payload)
        except Exception:  # rank 0 fails the same way and answers the client; keep serving
            log.exception("%s failed", command)


def rank_main(options_path: str) -> int:
    with open(options_path) as f:
        opts = json.load(f)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for name in ("transformers", "datasets", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    stop = threading.Event()
    if rank == 0:  # rank 0 decides when the world ends; the others follow its shutdown broadcast
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        _write_atomic(opts["pid_file"], str(os.getpid()))
    else:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(opts["threads"])
    if opts["device"] == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="nccl" if opts["device"] == "cuda" else "gloo")
    commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    try:
        if rank == 0:
            return _serve_rank0(opts, commands, stop)
        _command_loop(TrainerWorld(opts["device"]), commands)
        return 0
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- `rlcore trainer serve`


def _usage_error(message: str) -> int:
    print(f"rlcore: error: {message}", file=sys.stderr)
    return _EXIT_USAGE


def serve_main(args: argparse.Namespace) -> int:
    """Start the trainer world (torchrun) and wait for it; SIGTERM/Ctrl-C stop it through rank 0."""
    try:
        read_token(args.token_env)
    except ValueError as e:
        return _usage_error(str(e))
    if args.ranks < 1:
        return _usage_error(f"--ranks must be >= 1; got {args.ranks}")
    if bool(args.tls_cert) != bool(args.tls_key):
        return _usage_error("--tls-cert and --tls-key go together")
    if args.tls_require_client_cert and not (args.tls_cert and args.tls_ca):
        return _usage_error("--tls-require-client-cert needs --tls-cert, --tls-key and --tls-ca")
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        return _usage_error("--device cuda but no CUDA device is visible; use --device cpu (or auto)")
    device = ("cuda" if cuda else "cpu") if args.device == "auto" else args.device
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.ranks)

    workdir = tempfile.mkdtemp(prefix="rlcore-trainer-")
    options = {
        "device": device, "threads": threads, "host": args.host, "port": args.port,
        "port_file": os.path.abspath(args.port_file) if args.port_file else None,
        "token_env": args.token_env, "max_message_mb": args.max_message_mb,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_ca": args.tls_ca,
        "tls_require_client_cert": args.tls_require_client_cert,
        "pid_file": os.path.join(workdir, "rank0.pid"),
    }  # fmt: skip
    options_path = os.path.join(workdir, "options.json")
    with open(options_path, "w") as f:
        json.dump(options, f)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(args.ranks), "-m", "rlcore.core.trainer_service", options_path,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(cmd, env=env)

    def on_sigterm(*_: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return proc.wait()
    except _Terminated:
        return _stop_world(proc, options["pid_file"])
    except KeyboardInterrupt:
        _stop_world(proc, options["pid_file"])
        print("rlcore: interrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(workdir, ignore_errors=True)


class _Terminated(Exception):
    """SIGTERM reached `rlcore trainer serve`."""


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
    sys.exit(rank_main(sys.argv[1]))
