"""The rollout worker: a RolloutEngine behind gRPC (RolloutService). `rlcore rollout serve` is in
serve.py, the weight-sync calls in rlcore.weights.receiver.

One engine serves every call. Engine calls are serialised by one lock (an engine is one batch at a
time); streaming calls take it chunk by chunk (a seeded prompt samples the same whatever chunk it
falls in, engines seed each prompt by itself), so concurrent streams interleave and an early chunk's
completions go out before the next chunk runs. Workflows generate through a BatchingEngine
(batching.py): the generation calls of concurrent RunTasks streams are merged into shared engine
calls, and a task's reward or environment runs without holding the engine or the gate.
A GenerationGate holds the pause state: Pause and a weight update wait for running generation
calls (for RunTasks: the engine call running, not whole tasks), then new ones are refused with
UNAVAILABLE until Resume / FinishWeightUpdate, while running tasks' next engine calls wait.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from typing import Any, cast

import grpc

from ..core.data.prompts import template_kwargs_problem
from ..core.reasoning import reasoning_tags_problem
from ..core.rpc.convert import (
    completion_to_proto,
    experience_to_proto,
    sampling_from_proto,
    task_from_proto,
)
from ..core.rpc.errors import DeadlineExceeded, InvalidArgument, NotFound, require
from ..core.rpc.server import RpcServer, ServerOptions, Service
from ..core.services import check_auxiliary
from ..core.types import SamplingParams, Task, WorkflowSpec, by_episode
from ..proto.v1 import rollout_pb2, rollout_pb2_grpc
from ..weights.receiver import WeightReceiver
from .batching import BatchingEngine
from .engines.adapters import NAME as ADAPTER_NAME
from .engines.adapters import AdapterNotHeld
from .engines.base import RolloutEngine
from .episodes import EpisodeRecorder
from .gate import GenerationGate
from .rewards.compose import resolve_reward
from .rewards.judge import JUDGE, check_judge
from .rewards.reward_model import REWARD_MODEL, check_reward_model
from .workflows import WORKFLOWS, build_workflow, resolve_workflow
from .workflows.base import Workflow, WorkflowContext, sampled_at

log = logging.getLogger("rlcore.rollout.server")

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
MAX_CACHED_WORKFLOWS = 32
"""Built workflows kept by spec (each holds resolved reward functions); the oldest goes first."""
POLL_S = 0.5
"""Longest a waiting Pause goes without checking that its caller is still there."""


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
        partial_rollout: bool = False,
        workflow_context: WorkflowContext | None = None,
    ):
        """`partial_rollout`: a weight update interrupts the tasks' engine calls (rollout/gate.py);
        `workflow_context`: what this process hands the workflows it builds (serve.py: a loopback door)."""
        self.engine = engine
        self.workflow_context = workflow_context
        self.engine_name = engine_name
        self.model_path = model_path
        self.worker_id = worker_id
        """Set by serve_main once the worker registered with a run."""
        self.max_message_bytes = max_message_bytes
        self.tokenizer: Any = engine.tokenizer
        self.vocab_size = len(self.tokenizer)
        self.max_model_len = engine.max_model_len
        self.max_batch_size = engine.max_batch_size
        self._engine_lock = threading.Lock()
        self.gate = GenerationGate(interrupts=partial_rollout)
        self.batching = BatchingEngine(engine, self._engine_lock, self.gate)
        """What workflows generate through (concurrent tasks' calls merged, each engine call gated)."""
        self._workflows: OrderedDict[tuple, Workflow] = OrderedDict()
        self._workflows_lock = threading.Lock()
        self.weights = WeightReceiver(engine, self._engine_lock, self.gate)
        self.episodes = EpisodeRecorder()
        """Episodes the OpenAI-compatible door records (openai_door.py); FinishEpisode ends them."""

    # ------------------------------------------------------------------------------------------
    # generation

    def Generate(self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext) -> Any:
        sampling = self._sampling(request.sampling)
        prompts = self._prompts(request.prompts, sampling)
        with self.gate.admit():
            results, version = self._generate(prompts, sampling)
            self.gate.count(sum(len(c.token_ids) for samples in results for c in samples))
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
        with self.gate.admit():
            for indices in self._chunks(len(prompts), sampling):
                if not context.is_active():  # the caller left: do not generate for nobody
                    return
                results, version = self._generate([prompts[i] for i in indices], sampling)
                self.gate.count(sum(len(c.token_ids) for samples in results for c in samples))
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
        self.gate.check()  # a paused worker takes no new tasks; running ones wait at their engine calls
        for indices in self._chunks(len(tasks), sampling):
            if not context.is_active():
                return
            version = self.engine.policy_version  # the version the chunk starts on (batching.py)
            try:
                experiences = sampled_at(
                    workflow.run([tasks[i] for i in indices], sampling, version), sampling
                )
            except AdapterNotHeld as e:  # unloaded since the request was checked
                raise NotFound(f"sampling.adapter: {e}") from None
            except ValueError as e:  # a reward function refused a task (the engine's are validated)
                raise InvalidArgument("workflow.reward_fn", str(e)) from e
            self.gate.count(sum(len(e.response_token_ids) for e in experiences))
            episodes = by_episode(experiences)  # n per task; an episode may be several samples
            for j, i in enumerate(indices):
                yield rollout_pb2.RunTasksResponse(
                    task_index=i,
                    experiences=[experience_to_proto(e) for ep in episodes[j * n : (j + 1) * n] for e in ep],
                )

    def _generate(self, prompts: list[list[int]], sampling: SamplingParams) -> tuple[list[list[Any]], int]:
        """One engine call under the engine lock: its completions and the weights' version."""
        with self.batching.exclusive():  # the running batch lets it in between its calls
            try:
                return self.engine.generate(prompts, sampling), self.engine.policy_version
            except AdapterNotHeld as e:  # unloaded since the request was checked
                raise NotFound(f"sampling.adapter: {e}") from None

    def _chunks(self, num_prompts: int, sampling: SamplingParams) -> list[list[int]]:
        """Prompt indices per engine call of at most max_batch_size sequences (at least one prompt;
        greedy decodes each prompt once, as the engine does)."""
        per_prompt = 1 if sampling.temperature == 0 else sampling.n
        step = max(1, self.max_batch_size // per_prompt)
        return [list(range(s, min(s + step, num_prompts))) for s in range(0, num_prompts, step)]

    # ------------------------------------------------------------------------------------------
    # validation

    def _sampling(self, msg: Any) -> SamplingParams:
        sampling = sampling_from_proto(msg, "sampling")
        require(
            sampling.max_tokens < self.max_model_len,
            "sampling.max_tokens",
            f"{sampling.max_tokens} leaves no room for a prompt within max_model_len {self.max_model_len}",
        )
        for name, ids in (
            ("logit_bias", list(sampling.logit_bias)),
            ("stop_token_ids", sampling.stop_token_ids),
        ):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            require(
                not bad,
                f"sampling.{name}",
                f"token id {bad[0] if bad else 0} is outside [0, {self.vocab_size})",
            )
        held = self.engine.adapter_names()
        require(
            not sampling.adapter or sampling.adapter in held,
            "sampling.adapter",
            f"adapter '{sampling.adapter}' is not held by this worker (held: {', '.join(sorted(held)) or 'none'}; "
            "LoadAdapter loads one)",
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
                # As core/data/prompts.py encodes task prompts: no special tokens added.
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

    def _workflow(self, spec: rollout_pb2.WorkflowSpec) -> Workflow:
        """The workflow a spec names, built once per distinct spec."""
        names, weights = list(spec.reward_fn), list(spec.reward_weights)
        chat_template = spec.chat_template if spec.HasField("chat_template") else None
        system_prompt = spec.system_prompt if spec.HasField("system_prompt") else None
        tags = list(spec.reasoning_tags)
        key = (spec.name, tuple(names), tuple(weights), spec.max_prompt_tokens, spec.apply_chat_template,
               chat_template, system_prompt, spec.args_json, spec.auxiliary_json, spec.judge_json, tuple(tags),
               spec.chat_template_kwargs_json, spec.reward_model_json)  # fmt: skip
        with self._workflows_lock:
            cached = self._workflows.get(key)
        if cached is not None:
            return cached
        try:
            resolve_workflow(spec.name)  # an import path runs user code here, as a reward_fn's does
        except ValueError as e:
            raise InvalidArgument(
                "workflow.name",
                f"{e} (registered: {', '.join(WORKFLOWS)}; or an import path 'pkg.mod:Class')",
            ) from None
        args = _workflow_args(spec.args_json)
        auxiliary = _auxiliary(spec.auxiliary_json)
        require(bool(names), "workflow.reward_fn", "must list at least one reward function")
        judge = _judge(spec.judge_json, names, auxiliary)
        scorer = _reward_model(spec.reward_model_json, names)
        for i, name in enumerate(names):
            require(names.index(name) == i, f"workflow.reward_fn[{i}]", f"'{name}' is listed twice")
            if name in (JUDGE, REWARD_MODEL):
                continue  # built from judge_json and reward_model_json, checked above
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
        why = reasoning_tags_problem(tags)
        require(why is None, "workflow.reasoning_tags", why or "")
        template_kwargs = cast(
            dict[str, Any], _json_field(spec.chat_template_kwargs_json, "workflow.chat_template_kwargs_json", dict) or {}
        )
        why = template_kwargs_problem(template_kwargs)
        require(why is None, "workflow.chat_template_kwargs_json", why or "")
        try:
            workflow = build_workflow(
                WorkflowSpec(names, weights, spec.max_prompt_tokens, spec.apply_chat_template, chat_template,
                             system_prompt, spec.name, args, auxiliary, judge, tags, template_kwargs, scorer),
                cast(RolloutEngine, self.batching), self.tokenizer, self.workflow_context,
            )  # fmt: skip
        except ValueError as e:  # the workflow refuses its settings
            raise InvalidArgument("workflow.args_json", str(e)) from None
        with self._workflows_lock:
            self._workflows[key] = workflow
            while len(self._workflows) > MAX_CACHED_WORKFLOWS:
                self._workflows.popitem(last=False)
        return workflow

    def _tasks(self, msgs: Any, workflow: Workflow, sampling: SamplingParams) -> list[Task]:
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

    def FinishEpisode(self, request: rollout_pb2.FinishEpisodeRequest, context: grpc.ServicerContext) -> Any:
        require(bool(request.episode_id), "episode_id", "must be non-empty")
        require(math.isfinite(request.reward), "reward", f"must be finite; got {request.reward}")
        experiences = self.episodes.finish(request.episode_id, request.reward, request.group_id)
        if experiences is None:
            raise NotFound(
                f"episode_id: no episode '{request.episode_id}' is recorded here (tag the HTTP requests with it; "
                "a finished or evicted episode is gone)"
            )
        return rollout_pb2.FinishEpisodeResponse(experiences=[experience_to_proto(e) for e in experiences])

    def GetInfo(self, request: rollout_pb2.GetInfoRequest, context: grpc.ServicerContext) -> Any:
        paused, active, completed, tokens = self.gate.snapshot()
        busy_s, busy_span_s = self.gate.busy()
        return rollout_pb2.GetInfoResponse(
            model_path=self.model_path, engine=self.engine_name, max_model_len=self.max_model_len,
            max_batch_size=self.max_batch_size, policy_version=self.engine.policy_version, paused=paused,
            active_requests=active, completed_requests=completed, generated_tokens=tokens,
            vocab_size=self.vocab_size, worker_id=self.worker_id, max_message_bytes=self.max_message_bytes,
            weight_sync_ranks=self.engine.weight_sync_ranks, busy_s=busy_s, busy_span_s=busy_span_s,
            interrupted_sequences=self.batching.interrupted, adapters=sorted(self.engine.adapter_names()),
        )  # fmt: skip

    def LoadAdapter(self, request: rollout_pb2.LoadAdapterRequest, context: grpc.ServicerContext) -> Any:
        return rollout_pb2.LoadAdapterResponse(adapters=self.load_adapter(request.name, request.path))

    def UnloadAdapter(self, request: rollout_pb2.UnloadAdapterRequest, context: grpc.ServicerContext) -> Any:
        return rollout_pb2.UnloadAdapterResponse(adapters=self.unload_adapter(request.name))

    def load_adapter(self, name: str, path: str) -> list[str]:
        """Hold a LoRA adapter beside the engine's weights (engines/adapters.py); the names held now.
        InvalidArgument naming `name` or `path` when it cannot."""
        with self.batching.exclusive():  # not while a batch decodes
            try:
                self.engine.load_adapter(name, path)
            except (ValueError, OSError) as e:
                raise InvalidArgument("path" if ADAPTER_NAME.match(name) else "name", str(e)) from None
        return sorted(self.engine.adapter_names())

    def unload_adapter(self, name: str) -> list[str]:
        with self.batching.exclusive():
            try:
                self.engine.unload_adapter(name)
            except KeyError as e:
                raise NotFound(e.args[0]) from None
        return sorted(self.engine.adapter_names())

    def Pause(self, request: rollout_pb2.PauseRequest, context: grpc.ServicerContext) -> Any:
        self.gate.close()
        # Running calls finish first; stop waiting if the caller gave up (its deadline passed).
        while not self.gate.wait_idle(timeout=POLL_S):
            if not context.is_active():
                raise DeadlineExceeded(
                    f"{self.gate.active} generation call(s) still running; the worker stays paused"
                )
        self.engine.pause()
        return rollout_pb2.PauseResponse(policy_version=self.engine.policy_version)

    def Resume(self, request: rollout_pb2.ResumeRequest, context: grpc.ServicerContext) -> Any:
        self.weights.open_gate()
        self.engine.resume()
        return rollout_pb2.ResumeResponse(policy_version=self.engine.policy_version)

    # ------------------------------------------------------------------------------------------
    # weight sync (weights/receiver.py)

    def InitWeightSync(
        self, request: rollout_pb2.InitWeightSyncRequest, context: grpc.ServicerContext
    ) -> Any:
        return self.weights.init(request)

    def BeginWeightUpdate(
        self, request: rollout_pb2.BeginWeightUpdateRequest, context: grpc.ServicerContext
    ) -> Any:
        return self.weights.begin(request)

    def FinishWeightUpdate(
        self, request: rollout_pb2.FinishWeightUpdateRequest, context: grpc.ServicerContext
    ) -> Any:
        return self.weights.finish(request)


# ----------------------------------------------------------------------------------------------
# building and running a worker


def rollout_service(servicer: RolloutServicer) -> Service:
    return Service(SERVICE_NAME, servicer, rollout_pb2_grpc.add_RolloutServiceServicer_to_server)


def build_rollout_server(
    engine: RolloutEngine,
    *,
    engine_name: str,
    model_path: str,
    options: ServerOptions,
    worker_id: str = "",
    partial_rollout: bool = False,
) -> RpcServer:
    """A started server for `engine` (health, reflection, token and limits from `options`)."""
    servicer = RolloutServicer(
        engine, engine_name=engine_name, model_path=model_path, worker_id=worker_id,
        max_message_bytes=options.max_message_bytes, partial_rollout=partial_rollout,
    )  # fmt: skip
    return RpcServer(options, [rollout_service(servicer)])


def _json_field(text: str, field: str, kind: type) -> Any:
    """A RunTasks JSON field decoded (None when empty); INVALID_ARGUMENT naming `field` unless it is
    valid JSON of `kind` (dict: an object, list: a list)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(field, f"is not valid JSON ({e})") from None
    shape = "a JSON object" if kind is dict else "a JSON list"
    require(isinstance(value, kind), field, f"must be {shape}; got {type(value).__name__}")
    return value


def _workflow_args(text: str) -> dict[str, Any]:
    """RunTasks' workflow.args_json as a dict (empty: none)."""
    return cast(dict[str, Any], _json_field(text, "workflow.args_json", dict) or {})


def _judge(text: str, names: list[str], auxiliary: list[dict[str, Any]]) -> dict[str, Any] | None:
    """RunTasks' workflow.judge_json as checked settings: given exactly when reward_fn lists 'judge'."""
    if JUDGE not in names:
        require(not text, "workflow.judge_json", "is set but reward_fn does not list 'judge'")
        return None
    require(
        bool(text),
        "workflow.judge_json",
        "reward_fn lists 'judge': give its settings (model, template, parse)",
    )
    settings = _json_field(text, "workflow.judge_json", dict)
    try:
        check_judge(settings, [a["name"] for a in auxiliary])
    except ValueError as e:
        raise InvalidArgument("workflow.judge_json", str(e)) from None
    return cast(dict[str, Any], settings)


def _reward_model(text: str, names: list[str]) -> dict[str, Any] | None:
    """RunTasks' workflow.reward_model_json as checked settings: given exactly when reward_fn lists
    'reward_model'; its path a model folder on this worker."""
    if REWARD_MODEL not in names:
        require(not text, "workflow.reward_model_json", "is set but reward_fn does not list 'reward_model'")
        return None
    require(bool(text), "workflow.reward_model_json", "reward_fn lists 'reward_model': give its settings (path)")
    settings = _json_field(text, "workflow.reward_model_json", dict)
    try:
        check_reward_model(settings)
    except ValueError as e:
        raise InvalidArgument("workflow.reward_model_json", str(e)) from None
    return cast(dict[str, Any], settings)


def _auxiliary(text: str) -> list[dict[str, Any]]:
    """RunTasks' workflow.auxiliary_json as a checked list of service specs (empty: none)."""
    specs = _json_field(text, "workflow.auxiliary_json", list) or []
    try:
        check_auxiliary(specs)
    except ValueError as e:
        raise InvalidArgument("workflow.auxiliary_json", str(e)) from None
    return cast(list[dict[str, Any]], specs)
