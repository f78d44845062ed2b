"""The rollout worker: a RolloutEngine behind gRPC (RolloutService), and `rlcore rollout serve`.

One engine serves every call. Engine calls are serialised by one lock (an engine is one batch at a
time, and seeded sampling reseeds the process-wide RNG); streaming calls take it chunk by chunk, so
concurrent streams interleave and an early chunk's completions go out before the next chunk runs.
A condition guards the pause state: Pause and a weight update wait for running generation calls,
then new ones are refused with UNAVAILABLE until Resume / FinishWeightUpdate.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

import grpc

from ..core.rpc.convert import (
    completion_to_proto,
    experience_to_proto,
    sampling_from_proto,
    task_from_proto,
)
from ..core.rpc.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ServiceError,
    Unavailable,
    require,
)
from ..core.rpc.security import TLSFiles, read_token
from ..core.rpc.server import MiB, RpcServer, ServerOptions, Service
from ..core.types import SamplingParams, Task
from ..core.weight_sync import (
    SyncGroup,
    TensorSpec,
    init_group,
    plan_buckets,
    receive_weights,
    specs_from_proto,
)
from ..proto.v1 import rollout_pb2, rollout_pb2_grpc
from .engines.base import RolloutEngine
from .rewards.compose import build_reward, resolve_reward
from .workflows.single_turn import SingleTurnWorkflow

log = logging.getLogger("rlcore.rollout.server")

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
WORKFLOWS = {"single_turn": SingleTurnWorkflow}
"""Workflows a RunTasks request may name."""
MAX_CACHED_WORKFLOWS = 32
"""Built workflows kept by spec (each holds resolved reward functions); the oldest goes first."""
POLL_S = 0.5
"""Longest a waiting Pause goes without checking that its caller is still there."""


def chunk_seed(seed: int | None, chunk: int) -> int | None:
    """Seed of a streamed request's chunk: chunk 0 keeps the request's seed (so a request that fits
    one engine batch samples what Generate samples), later chunks get distinct derived seeds (the
    same seed would repeat chunk 0's random draws)."""
    if seed is None or chunk == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class _Update:
    """A weight update between BeginWeightUpdate and FinishWeightUpdate."""

    version: int
    thread: threading.Thread | None = None
    phase: str = "waiting for running generation to finish"
    stats: dict[str, float] = field(default_factory=dict)
    load_s: float = 0.0
    error: BaseException | None = None


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """RolloutService over one engine. Every request is validated before the engine sees it; bad
    input raises InvalidArgument naming the field (the server maps it and keeps serving)."""

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        engine_name: str,
        model_path: str,
        worker_id: str = "",
        max_message_bytes: int = 0,
    ):
        self.engine = engine
        self.engine_name = engine_name
        self.model_path = model_path
        self.worker_id = worker_id
        """Set by serve_main once the worker registered with a run."""
        self.max_message_bytes = max_message_bytes
        # Not in the RolloutEngine interface, but every engine has them (see engines/base.py).
        attrs = cast(Any, engine)
        self.tokenizer: Any = attrs.tokenizer
        self.vocab_size = len(self.tokenizer)
        self.max_model_len: int = attrs.max_model_len
        self.max_batch_size: int = attrs.max_batch_size
        self.device = str(getattr(engine, "device", "cpu"))
        self._engine_lock = threading.Lock()
        self._state = threading.Condition()
        self._paused = False
        self._active = 0
        self._completed = 0
        self._generated_tokens = 0
        self._workflows: OrderedDict[tuple, SingleTurnWorkflow] = OrderedDict()
        self._sync_lock = threading.Lock()
        self._group: SyncGroup | None = None
        self._update: _Update | None = None

    # ------------------------------------------------------------------------------------------
    # generation

    def Generate(self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext) -> Any:
        sampling = self._sampling(request.sampling)
        prompts = self._prompts(request.prompts, sampling)
        with self._generation():
            with self._engine_lock:
                results = self.engine.generate(prompts, sampling)
                version = self.engine.policy_version
            self._count(c.token_ids for samples in results for c in samples)
        return rollout_pb2.GenerateResponse(
            results=[
                rollout_pb2.PromptCompletions(
                    completions=[completion_to_proto(c, i, s, version) for s, c in enumerate(samples)]
                )
                for i, samples in enumerate(results)
            ],
            policy_version=version,
        )

    def GenerateStream(self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext) -> Any:
        sampling = self._sampling(request.sampling)
        prompts = self._prompts(request.prompts, sampling)
        with self._generation():
            for k, indices in enumerate(self._chunks(len(prompts), sampling)):
                if not context.is_active():  # the caller left: do not generate for nobody
                    return
                chunk_sampling = replace(sampling, seed=chunk_seed(sampling.seed, k))
                with self._engine_lock:
                    results = self.engine.generate([prompts[i] for i in indices], chunk_sampling)
                    version = self.engine.policy_version
                self._count(c.token_ids for samples in results for c in samples)
                for i, samples in zip(indices, results, strict=True):
                    for s, c in enumerate(samples):
                        yield rollout_pb2.GenerateStreamResponse(
                            completion=completion_to_proto(c, i, s, version)
                        )

    def RunTasks(self, request: rollout_pb2.RunTasksRequest, context: grpc.ServicerContext) -> Any:
        sampling = self._sampling(request.sampling)
        workflow = self._workflow(request.workflow)
        tasks = self._tasks(request.tasks, workflow, sampling)
        n = sampling.n
        with self._generation():
            for k, indices in enumerate(self._chunks(len(tasks), sampling)):
                if not context.is_active():
                    return
                chunk_sampling = replace(sampling, seed=chunk_seed(sampling.seed, k))
                with self._engine_lock:
                    version = self.engine.policy_version
                    try:
                        experiences = workflow.run([tasks[i] for i in indices], chunk_sampling, version)
                    except ValueError as e:  # a reward function refused a task (the engine's are validated)
                        raise InvalidArgument("workflow.reward_fn", str(e)) from e
                self._count(e.response_token_ids for e in experiences)
                for j, i in enumerate(indices):
                    yield rollout_pb2.RunTasksResponse(
                        task_index=i,
                        experiences=[experience_to_proto(e) for e in experiences[j * n : (j + 1) * n]],
                    )

    def _chunks(self, num_prompts: int, sampling: SamplingParams) -> list[list[int]]:
        """Prompt indices per engine call of at most max_batch_size sequences (at least one prompt;
        greedy decodes each prompt once, as the engine does)."""
        per_prompt = 1 if sampling.temperature == 0 else sampling.n
        step = max(1, self.max_batch_size // per_prompt)
        return [list(range(s, min(s + step, num_prompts))) for s in range(0, num_prompts, step)]

    @contextmanager
    def _generation(self) -> Iterator[None]:
        """Admit one generation call unless paused; count it while it runs."""
        with self._state:
            if self._paused:
                raise Unavailable("worker paused (Pause or a weight update); retry after Resume")
            self._active += 1
        try:
            yield
        finally:
            with self._state:
                self._active -= 1
                self._completed += 1
                self._state.notify_all()

    def _count(self, token_lists: Any) -> None:
        num = sum(len(t) for t in token_lists)
        with self._state:
            self._generated_tokens += num

    # ------------------------------------------------------------------------------------------
    # validation

    def _sampling(self, msg: Any) -> SamplingParams:
        sampling = sampling_from_proto(msg, "sampling")
        require(
            sampling.max_tokens < self.max_model_len,
            "sampling.max_tokens",
            f"{sampling.max_tokens} leaves no room for a prompt within max_model_len {self.max_model_len}",
        )
        return sampling

    def _check_length(self, field: str, num_prompt_tokens: int, sampling: SamplingParams) -> None:
        total = num_prompt_tokens + sampling.max_tokens
        require(
            total <= self.max_model_len,
            field,
            f"{num_prompt_tokens} prompt tokens + sampling.max_tokens {sampling.max_tokens} = {total} "
            f"exceed max_model_len {self.max_model_len}; shorten the prompt or lower max_tokens",
        )

    def _prompts(self, prompts: Any, sampling: SamplingParams) -> list[list[int]]:
        require(len(prompts) > 0, "prompts", "must list at least one prompt")
        out = []
        for i, p in enumerate(prompts):
            kind = p.WhichOneof("input")
            if kind == "text":
                require(bool(p.text), f"prompts[{i}].text", "must be non-empty")
                # As rollout/workflows/prompts.py encodes task prompts: no special tokens added.
                ids = list(self.tokenizer(p.text, add_special_tokens=False)["input_ids"])
                require(bool(ids), f"prompts[{i}].text", "tokenises to no tokens")
            elif kind == "token_ids":
                ids = list(p.token_ids.ids)
                require(bool(ids), f"prompts[{i}].token_ids", "must be non-empty")
                if not 0 <= min(ids) <= max(ids) < self.vocab_size:
                    j = next(j for j, t in enumerate(ids) if not 0 <= t < self.vocab_size)
                    raise InvalidArgument(
                        f"prompts[{i}].token_ids.ids[{j}]",
                        f"token id {ids[j]} is outside [0, {self.vocab_size})",
                    )
            else:
                raise InvalidArgument(f"prompts[{i}]", "give token_ids or text")
            self._check_length(f"prompts[{i}]", len(ids), sampling)
            out.append(ids)
        return out

    def _workflow(self, spec: rollout_pb2.WorkflowSpec) -> SingleTurnWorkflow:
        """The workflow a spec names, built once per distinct spec."""
        require(
            spec.name in WORKFLOWS,
            "workflow.name",
            f"must be one of {', '.join(WORKFLOWS)}; got '{spec.name}'",
        )
        names, weights = list(spec.reward_fn), list(spec.reward_weights)
        chat_template = spec.chat_template if spec.HasField("chat_template") else None
        system_prompt = spec.system_prompt if spec.HasField("system_prompt") else None
        key = (spec.name, tuple(names), tuple(weights), spec.max_prompt_tokens, spec.apply_chat_template,
               chat_template, system_prompt)  # fmt: skip
        with self._state:
            cached = self._workflows.get(key)
        if cached is not None:
            return cached
        require(bool(names), "workflow.reward_fn", "must list at least one reward function")
        for i, name in enumerate(names):
            require(names.index(name) == i, f"workflow.reward_fn[{i}]", f"'{name}' is listed twice")
            try:
                # Import paths run user code on this worker: the token is the trust boundary.
                resolve_reward(name)
            except ValueError as e:
                raise InvalidArgument(f"workflow.reward_fn[{i}]", str(e)) from None
        require(
            not weights or len(weights) == len(names),
            "workflow.reward_weights",
            f"has {len(weights)} entries for {len(names)} reward functions; give one each or none",
        )
        require(all(math.isfinite(w) for w in weights), "workflow.reward_weights", "must be finite")
        require(
            spec.max_prompt_tokens >= 1,
            "workflow.max_prompt_tokens",
            f"must be >= 1; got {spec.max_prompt_tokens}",
        )
        workflow = WORKFLOWS[spec.name](
            self.engine, self.tokenizer, build_reward(names, weights), max_prompt_tokens=spec.max_prompt_tokens,
            apply_chat_template=spec.apply_chat_template, chat_template=chat_template, system_prompt=system_prompt,
        )  # fmt: skip
        with self._state:
            self._workflows[key] = workflow
            while len(self._workflows) > MAX_CACHED_WORKFLOWS:
                self._workflows.popitem(last=False)
        return workflow

    def _tasks(self, msgs: Any, workflow: SingleTurnWorkflow, sampling: SamplingParams) -> list[Task]:
        require(len(msgs) > 0, "tasks", "must list at least one task")
        tasks = []
        for i, msg in enumerate(msgs):
            task = task_from_proto(msg, f"tasks[{i}]")
            require(bool(task.prompt), f"tasks[{i}].prompt", "must be non-empty")
            try:
                ids = workflow.encode_prompt(task)
            except Exception as e:  # a user chat template (Jinja) or a tokenizer without one
                field = (
                    "workflow.chat_template"
                    if workflow.prompt_format.chat_template
                    else "workflow.apply_chat_template"
                )
                raise InvalidArgument(field, f"cannot render tasks[{i}].prompt: {e}") from None
            require(bool(ids), f"tasks[{i}].prompt", "tokenises to no tokens")
            self._check_length(f"tasks[{i}]", len(ids), sampling)
            tasks.append(task)
        return tasks

    # ------------------------------------------------------------------------------------------
    # info, pause, resume

    def GetInfo(self, request: rollout_pb2.GetInfoRequest, context: grpc.ServicerContext) -> Any:
        with self._state:
            return rollout_pb2.GetInfoResponse(
                model_path=self.model_path, engine=self.engine_name, max_model_len=self.max_model_len,
                max_batch_size=self.max_batch_size, policy_version=self.engine.policy_version,
                paused=self._paused, active_requests=self._active, completed_requests=self._completed,
                generated_tokens=self._generated_tokens, vocab_size=self.vocab_size, worker_id=self.worker_id,
                max_message_bytes=self.max_message_bytes,
            )  # fmt: skip

    def Pause(self, request: rollout_pb2.PauseRequest, context: grpc.ServicerContext) -> Any:
        with self._state:
            self._paused = True
            # Running calls finish first; stop waiting if the caller gave up (its deadline passed).
            while not self._state.wait_for(lambda: self._active == 0, timeout=POLL_S):
                if not context.is_active():
                    raise DeadlineExceeded(
                        f"{self._active} generation call(s) still running; the worker stays paused"
                    )
        self.engine.pause()
        return rollout_pb2.PauseResponse(policy_version=self.engine.policy_version)

    def Resume(self, request: rollout_pb2.ResumeRequest, context: grpc.ServicerContext) -> Any:
        with self._sync_lock:
            update = self._update
            if update is not None and update.thread is not None and update.thread.is_alive():
                raise FailedPrecondition(
                    f"a weight update to version {update.version} is running; FinishWeightUpdate resumes"
                )
            with self._state:
                self._paused = False
        self.engine.resume()
        return rollout_pb2.ResumeResponse(policy_version=self.engine.policy_version)

    # ------------------------------------------------------------------------------------------
    # weight sync (see rlcore.core.weight_sync)

    def InitWeightSync(
        self, request: rollout_pb2.InitWeightSyncRequest, context: grpc.ServicerContext
    ) -> Any:
        r = request
        require(bool(r.master_address), "master_address", "must be non-empty")
        require(1 <= r.master_port <= 65535, "master_port", f"must be in 1..65535; got {r.master_port}")
        require(
            r.world_size >= 2, "world_size", f"must be >= 2 (a sender and this worker); got {r.world_size}"
        )
        require(1 <= r.rank < r.world_size, "rank", f"must be in 1..{r.world_size - 1}; got {r.rank}")
        require(r.backend in ("gloo", "nccl"), "backend", f"must be gloo or nccl; got '{r.backend}'")
        require(
            math.isfinite(r.timeout_s) and r.timeout_s > 0, "timeout_s", f"must be > 0; got {r.timeout_s}"
        )
        require(bool(r.group_name), "group_name", "must be non-empty")
        with self._sync_lock:
            self._check_no_running_update()
            # A new group replaces the old one (the sender re-forms it after a failed collective).
            self._group = None
        try:  # outside the lock: forming the group blocks until the sender joins
            group = init_group(
                r.master_address, r.master_port, r.world_size, r.rank, r.backend, r.timeout_s, r.group_name
            )
        except RuntimeError as e:
            raise DeadlineExceeded(
                f"weight-sync group '{r.group_name}' at {r.master_address}:{r.master_port} did not form "
                f"within {r.timeout_s:g} s: {e}"
            ) from None
        with self._sync_lock:
            self._group = group
        return rollout_pb2.InitWeightSyncResponse(rank=r.rank)

    def _check_no_running_update(self) -> None:
        """Refuse while an update thread runs; forget a finished one nobody collected (the sender
        gave up on it and starts over)."""
        update = self._update
        if update is None:
            return
        if update.thread is not None and update.thread.is_alive():
            raise FailedPrecondition(
                f"the weight update to version {update.version} is still running ({update.phase}); "
                "call FinishWeightUpdate first"
            )
        log.warning("dropping the uncollected weight update to version %d", update.version)
        self._update = None

    def BeginWeightUpdate(
        self, request: rollout_pb2.BeginWeightUpdateRequest, context: grpc.ServicerContext
    ) -> Any:
        with self._sync_lock:
            group = self._group
            if group is None:
                raise FailedPrecondition("no weight-sync group: call InitWeightSync first")
            self._check_no_running_update()
            current = self.engine.policy_version
            require(
                request.policy_version > current,
                "policy_version",
                f"must be greater than the version served now ({current}); got {request.policy_version}",
            )
            specs = specs_from_proto(request.tensors, "tensors")
            require(request.bucket_bytes > 0, "bucket_bytes", f"must be > 0; got {request.bucket_bytes}")
            num_buckets = len(plan_buckets(specs, request.bucket_bytes))
            with self._state:
                self._paused = True
            update = _Update(request.policy_version)
            update.thread = threading.Thread(
                target=self._receive_and_load,
                args=(update, group, specs, request.bucket_bytes),
                name=f"weight-update-v{request.policy_version}",
                daemon=True,
            )
            self._update = update
            update.thread.start()
        return rollout_pb2.BeginWeightUpdateResponse(num_buckets=num_buckets)

    def _receive_and_load(
        self, update: _Update, group: SyncGroup, specs: list[TensorSpec], bucket_bytes: int
    ) -> None:
        try:
            with self._state:
                self._state.wait_for(lambda: self._active == 0)
            with self._engine_lock:
                start = time.perf_counter()
                weights = receive_weights(group, specs, bucket_bytes, self.device, update.stats)
                self.engine.load_weights(self._tracked(update, weights), update.version)
                update.load_s = time.perf_counter() - start - update.stats.get("receive_s", 0.0)
        except BaseException as e:  # reported by FinishWeightUpdate
            update.error = e

    @staticmethod
    def _tracked(update: _Update, weights: Iterator[Any]) -> Iterator[Any]:
        """Pass `weights` through, recording whether the update is receiving or loading."""
        while True:
            update.phase = "receiving"
            try:
                item = next(weights)
            except StopIteration:
                return
            update.phase = "loading"
            yield item

    def FinishWeightUpdate(
        self, request: rollout_pb2.FinishWeightUpdateRequest, context: grpc.ServicerContext
    ) -> Any:
        with self._sync_lock:
            update, group = self._update, self._group
            if update is None or group is None:
                raise FailedPrecondition("no weight update is pending: call BeginWeightUpdate first")
            require(
                request.policy_version == update.version,
                "policy_version",
                f"must be {update.version}, the version BeginWeightUpdate announced; got {request.policy_version}",
            )
        assert update.thread is not None
        update.thread.join(timeout=group.timeout_s)
        what = f"weight update to version {update.version}"
        if update.thread.is_alive():
            raise DeadlineExceeded(
                f"{what} did not finish within {group.timeout_s:g} s (phase: {update.phase}); the worker "
                f"stays paused serving version {self.engine.policy_version}"
            )
        with self._sync_lock:
            if self._update is not update:
                raise FailedPrecondition(f"{what} was already finished by another call")
            self._update = None
        if update.error is not None:
            raise ServiceError(
                f"{what} failed while {update.phase}: {type(update.error).__name__}: {update.error}; the worker "
                f"stays paused (its weights may be partly replaced); sync a new version to recover"
            )
        self.engine.policy_version = update.version
        with self._state:
            self._paused = False
        self.engine.resume()
        return rollout_pb2.FinishWeightUpdateResponse(
            policy_version=update.version,
            num_bytes=int(update.stats["num_bytes"]),
            receive_s=update.stats["receive_s"],
            load_s=update.load_s,
        )


# ----------------------------------------------------------------------------------------------
# building and running a worker


def rollout_service(servicer: RolloutServicer) -> Service:
    return Service(SERVICE_NAME, servicer, rollout_pb2_grpc.add_RolloutServiceServicer_to_server)


def build_rollout_server(
    engine: RolloutEngine, *, engine_name: str, model_path: str, options: ServerOptions, worker_id: str = ""
) -> RpcServer:
    """A started server for `engine` (health, reflection, token and limits from `options`)."""
    servicer = RolloutServicer(
        engine, engine_name=engine_name, model_path=model_path, worker_id=worker_id,
        max_message_bytes=options.max_message_bytes,
    )  # fmt: skip
    return RpcServer(options, [rollout_service(servicer)])


def _fail(message: str) -> int:
    print(f"rlcore: error: {message}", file=sys.stderr, flush=True)
    return 2


def _tls(args: argparse.Namespace) -> TLSFiles | None:
    if not (args.tls_cert or args.tls_key or args.tls_ca or args.tls_require_client_cert):
        return None
    if not (args.tls_cert and args.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if args.tls_require_client_cert and not args.tls_ca:
        raise ValueError("--tls-require-client-cert needs --tls-ca (the CA client certificates chain to)")
    return TLSFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_require_client_cert)


def _write_port_file(path: str, address: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(address)
    os.replace(tmp, path)  # readers never see a half-written file


def _heartbeat_loop(
    run: Any, worker_id: str, interval_s: float, servicer: RolloutServicer, stop: threading.Event
) -> None:
    from ..client.base import RpcError

    while not stop.wait(interval_s):
        try:
            run.heartbeat(worker_id, policy_version=servicer.engine.policy_version)
        except RpcError as e:
            log.warning("heartbeat to the run at %s failed: %s", run.address, e)


def serve_main(args: argparse.Namespace) -> int:
    """`rlcore rollout serve`: load the engine, serve until SIGINT/SIGTERM; returns the exit code."""
    try:
        token = read_token(args.token_env)
        tls = _tls(args)
    except ValueError as e:
        return _fail(str(e))
    for name in ("max_model_len", "max_batch_size", "max_message_mb"):
        if getattr(args, name) < 1:
            return _fail(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")

    import torch

    from .engines import ENGINES

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    try:
        engine = ENGINES.resolve(args.engine)(
            args.model, device=device, dtype=dtype, max_model_len=args.max_model_len,
            max_batch_size=args.max_batch_size,
        )  # fmt: skip
    except (OSError, ValueError) as e:
        return _fail(f"cannot load --model {args.model} with the {args.engine} engine: {e}")
    options = ServerOptions(
        token=token, host=args.host, port=args.port, max_message_bytes=args.max_message_mb * MiB, tls=tls
    )
    servicer = RolloutServicer(
        engine, engine_name=args.engine, model_path=args.model, max_message_bytes=options.max_message_bytes
    )
    try:
        server = RpcServer(options, [rollout_service(servicer)])
    except OSError as e:
        return _fail(str(e))

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    run = None
    try:
        if args.port_file:
            _write_port_file(args.port_file, server.address)
        if args.register:
            from ..client.base import ClientOptions, RpcError
            from ..client.run import RunClient

            run = RunClient(args.register, ClientOptions(token=token, timeout=30.0, tls=tls))
            try:
                worker_id, interval_s = run.register_worker("rollout", server.address, args.index)
            except RpcError as e:
                return _fail(f"cannot register with the run at {args.register}: {e}")
            servicer.worker_id = worker_id
            if interval_s > 0:
                threading.Thread(
                    target=_heartbeat_loop, args=(run, worker_id, interval_s, servicer, stop), name="heartbeat",
                    daemon=True,
                ).start()  # fmt: skip
        print(f"rlcore: rollout worker serving {args.model} on {server.address}", flush=True)
        while not stop.wait(1.0):  # a short wait keeps the main thread responsive to signals
            pass
    finally:
        stop.set()
        server.stop()
        if run is not None:
            run.close()
        engine.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
