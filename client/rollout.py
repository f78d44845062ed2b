"""Clients of a rollout worker's RolloutService (`rlcore rollout serve`), blocking and asyncio.

Calls take and return rlcore.core.types dataclasses; protobuf stays inside this module. Every call
has a deadline (ClientOptions.timeout unless `timeout` is given) and is retried on UNAVAILABLE (a
paused or not yet started worker) with backoff; a failure raises RpcError with status and message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core.rpc.convert import (
    completion_from_proto,
    experience_from_proto,
    sampling_to_proto,
    task_to_proto,
)
from ..core.types import Completion, Experience, SamplingParams, Task, WorkflowSpec
from ..proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from .base import AsyncClient, BlockingClient


class TensorSpec(Protocol):
    """One tensor of a weight update as the worker is told of it (rlcore.weights.wire.TensorSpec;
    the client SDK does not import torch)."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


Prompt = list[int] | str
"""Token ids, or text the worker tokenises (no chat template, no special tokens added)."""


@dataclass
class GenerateResult:
    completions: list[list[Completion]]
    """Per prompt in request order, sampling.n completions in sample order."""
    policy_version: int
    """Version of the weights that generated them."""


@dataclass
class StreamedCompletion:
    prompt_index: int
    sample_index: int
    completion: Completion
    policy_version: int


def prompt_to_proto(prompt: Prompt) -> rollout_pb2.Prompt:
    if isinstance(prompt, str):
        return rollout_pb2.Prompt(text=prompt)
    return rollout_pb2.Prompt(token_ids=rollout_pb2.TokenIds(ids=prompt))


def generate_request(prompts: Sequence[Prompt], sampling: SamplingParams) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(
        prompts=[prompt_to_proto(p) for p in prompts], sampling=sampling_to_proto(sampling)
    )


def workflow_to_proto(w: WorkflowSpec) -> rollout_pb2.WorkflowSpec:
    msg = rollout_pb2.WorkflowSpec(
        name=w.name, reward_fn=w.reward_fn, reward_weights=w.reward_weights,
        max_prompt_tokens=w.max_prompt_tokens, apply_chat_template=w.apply_chat_template,
        args_json=json.dumps(w.args) if w.args else "",
        auxiliary_json=json.dumps(w.auxiliary_models) if w.auxiliary_models else "",
        judge_json=json.dumps(w.judge) if w.judge else "", reasoning_tags=list(w.reasoning_tags),
        chat_template_kwargs_json=json.dumps(w.chat_template_kwargs) if w.chat_template_kwargs else "",
        reward_model_json=json.dumps(w.reward_model) if w.reward_model else "",
    )  # fmt: skip
    if w.chat_template is not None:
        msg.chat_template = w.chat_template
    if w.system_prompt is not None:
        msg.system_prompt = w.system_prompt
    return msg


def run_tasks_request(
    tasks: Sequence[Task], sampling: SamplingParams, workflow: WorkflowSpec
) -> rollout_pb2.RunTasksRequest:
    return rollout_pb2.RunTasksRequest(
        tasks=[task_to_proto(t) for t in tasks],
        sampling=sampling_to_proto(sampling),
        workflow=workflow_to_proto(workflow),
    )


def _generate_result(msg: rollout_pb2.GenerateResponse) -> GenerateResult:
    return GenerateResult(
        completions=[[completion_from_proto(c) for c in r.completions] for r in msg.results],
        policy_version=msg.policy_version,
    )


def _streamed(msg: rollout_pb2.GenerateStreamResponse) -> StreamedCompletion:
    c = msg.completion
    return StreamedCompletion(c.prompt_index, c.sample_index, completion_from_proto(c), c.policy_version)


def _experiences(msg: rollout_pb2.RunTasksResponse) -> tuple[int, list[Experience]]:
    field = f"tasks[{msg.task_index}].experiences"
    return msg.task_index, [experience_from_proto(e, f"{field}[{j}]") for j, e in enumerate(msg.experiences)]


def init_weight_sync_request(
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    backend: str,
    timeout_s: float,
    group_name: str,
) -> rollout_pb2.InitWeightSyncRequest:
    return rollout_pb2.InitWeightSyncRequest(
        master_address=master_address, master_port=master_port, world_size=world_size, rank=rank,
        backend=backend, timeout_s=timeout_s, group_name=group_name,
    )  # fmt: skip


def begin_weight_update_request(
    policy_version: int,
    specs: Sequence[TensorSpec],
    bucket_bytes: int,
    checksums: bool = False,
    checkpoint_path: str = "",
) -> rollout_pb2.BeginWeightUpdateRequest:
    return rollout_pb2.BeginWeightUpdateRequest(
        policy_version=policy_version,
        tensors=[common_pb2.TensorMeta(name=s.name, dtype=s.dtype, shape=list(s.shape)) for s in specs],
        bucket_bytes=bucket_bytes,
        checksums=checksums,
        checkpoint_path=checkpoint_path,
    )


class RolloutClient(BlockingClient):
    """Blocking client of one rollout worker."""

    role = "rollout worker"
    stub_class = rollout_pb2_grpc.RolloutServiceStub

    def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingParams, timeout: float | None = None
    ) -> GenerateResult:
        """sampling.n completions per prompt, all at once."""
        return _generate_result(self._unary("Generate", generate_request(prompts, sampling), timeout))

    def generate_stream(
        self, prompts: Sequence[Prompt], sampling: SamplingParams, timeout: float | None = None
    ) -> Iterator[StreamedCompletion]:
        """The same completions one at a time, as each engine batch finishes (`timeout` bounds the
        whole stream)."""
        for msg in self._stream("GenerateStream", generate_request(prompts, sampling), timeout):
            yield _streamed(msg)

    def run_tasks(
        self,
        tasks: Sequence[Task],
        sampling: SamplingParams,
        workflow: WorkflowSpec,
        timeout: float | None = None,
    ) -> Iterator[tuple[int, list[Experience]]]:
        """(task index, its sampling.n scored experiences) per task, as soon as they are scored."""
        for msg in self._stream("RunTasks", run_tasks_request(tasks, sampling, workflow), timeout):
            yield _experiences(msg)

    def get_info(self, timeout: float | None = None) -> rollout_pb2.GetInfoResponse:
        return self._unary("GetInfo", rollout_pb2.GetInfoRequest(), timeout)

    def finish_episode(
        self, episode_id: str, reward: float, group_id: str = "", timeout: float | None = None
    ) -> list[Experience]:
        """End an episode the worker's HTTP door recorded: its experiences, scored with `reward`."""
        request = rollout_pb2.FinishEpisodeRequest(episode_id=episode_id, reward=reward, group_id=group_id)
        return [experience_from_proto(e) for e in self._unary("FinishEpisode", request, timeout).experiences]

    def load_adapter(self, name: str, path: str, timeout: float | None = None) -> list[str]:
        """Hold the LoRA adapter folder at `path` (on the worker's machine) under `name`, beside the
        weights; requests select it by SamplingParams.adapter. Answers the names held."""
        request = rollout_pb2.LoadAdapterRequest(name=name, path=path)
        return list(self._unary("LoadAdapter", request, timeout).adapters)

    def unload_adapter(self, name: str, timeout: float | None = None) -> list[str]:
        request = rollout_pb2.UnloadAdapterRequest(name=name)
        return list(self._unary("UnloadAdapter", request, timeout).adapters)

    def pause(self, timeout: float | None = None) -> int:
        """Refuse new generation once running calls finished; answers the version served."""
        return self._unary("Pause", rollout_pb2.PauseRequest(), timeout).policy_version

    def resume(self, timeout: float | None = None) -> int:
        return self._unary("Resume", rollout_pb2.ResumeRequest(), timeout).policy_version

    def init_weight_sync(
        self,
        master_address: str,
        master_port: int,
        world_size: int,
        rank: int,
        backend: str,
        timeout_s: float,
        group_name: str,
        timeout: float | None = None,
    ) -> int:
        """Join the weight-sync group at first rank `rank` (returns once it formed); answers the
        first rank held."""
        request = init_weight_sync_request(
            master_address, master_port, world_size, rank, backend, timeout_s, group_name
        )
        return self._unary("InitWeightSync", request, timeout).rank

    def begin_weight_update(
        self,
        policy_version: int,
        specs: Sequence[TensorSpec],
        bucket_bytes: int,
        timeout: float | None = None,
        *,
        checksums: bool = False,
        checkpoint_path: str = "",
    ) -> int:
        """Announce a version; the worker starts receiving at once (or loading `checkpoint_path`).
        Answers the buckets it expects."""
        request = begin_weight_update_request(policy_version, specs, bucket_bytes, checksums, checkpoint_path)
        return self._unary("BeginWeightUpdate", request, timeout).num_buckets

    def finish_weight_update(
        self, policy_version: int, timeout: float | None = None
    ) -> rollout_pb2.FinishWeightUpdateResponse:
        """Wait for the announced version to be loaded; answers the version served and timings."""
        request = rollout_pb2.FinishWeightUpdateRequest(policy_version=policy_version)
        return self._unary("FinishWeightUpdate", request, timeout)


class AsyncRolloutClient(AsyncClient):
    """asyncio client of one rollout worker; the same calls as RolloutClient."""

    role = "rollout worker"
    stub_class = rollout_pb2_grpc.RolloutServiceStub

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingParams, timeout: float | None = None
    ) -> GenerateResult:
        return _generate_result(await self._unary("Generate", generate_request(prompts, sampling), timeout))

    async def generate_stream(
        self, prompts: Sequence[Prompt], sampling: SamplingParams, timeout: float | None = None
    ) -> AsyncIterator[StreamedCompletion]:
        async for msg in self._stream("GenerateStream", generate_request(prompts, sampling), timeout):
            yield _streamed(msg)

    async def run_tasks(
        self,
        tasks: Sequence[Task],
        sampling: SamplingParams,
        workflow: WorkflowSpec,
        timeout: float | None = None,
    ) -> AsyncIterator[tuple[int, list[Experience]]]:
        async for msg in self._stream("RunTasks", run_tasks_request(tasks, sampling, workflow), timeout):
            yield _experiences(msg)

    async def get_info(self, timeout: float | None = None) -> rollout_pb2.GetInfoResponse:
        return await self._unary("GetInfo", rollout_pb2.GetInfoRequest(), timeout)

    async def finish_episode(
        self, episode_id: str, reward: float, group_id: str = "", timeout: float | None = None
    ) -> list[Experience]:
        request = rollout_pb2.FinishEpisodeRequest(episode_id=episode_id, reward=reward, group_id=group_id)
        return [
            experience_from_proto(e)
            for e in (await self._unary("FinishEpisode", request, timeout)).experiences
        ]

    async def load_adapter(self, name: str, path: str, timeout: float | None = None) -> list[str]:
        request = rollout_pb2.LoadAdapterRequest(name=name, path=path)
        return list((await self._unary("LoadAdapter", request, timeout)).adapters)

    async def unload_adapter(self, name: str, timeout: float | None = None) -> list[str]:
        request = rollout_pb2.UnloadAdapterRequest(name=name)
        return list((await self._unary("UnloadAdapter", request, timeout)).adapters)

    async def pause(self, timeout: float | None = None) -> int:
        return (await self._unary("Pause", rollout_pb2.PauseRequest(), timeout)).policy_version

    async def resume(self, timeout: float | None = None) -> int:
        return (await self._unary("Resume", rollout_pb2.ResumeRequest(), timeout)).policy_version

    async def init_weight_sync(
        self,
        master_address: str,
        master_port: int,
        world_size: int,
        rank: int,
        backend: str,
        timeout_s: float,
        group_name: str,
        timeout: float | None = None,
    ) -> int:
        request = init_weight_sync_request(
            master_address, master_port, world_size, rank, backend, timeout_s, group_name
        )
        return (await self._unary("InitWeightSync", request, timeout)).rank

    async def begin_weight_update(
        self,
        policy_version: int,
        specs: Sequence[TensorSpec],
        bucket_bytes: int,
        timeout: float | None = None,
        *,
        checksums: bool = False,
        checkpoint_path: str = "",
    ) -> int:
        request = begin_weight_update_request(policy_version, specs, bucket_bytes, checksums, checkpoint_path)
        return (await self._unary("BeginWeightUpdate", request, timeout)).num_buckets

    async def finish_weight_update(
        self, policy_version: int, timeout: float | None = None
    ) -> rollout_pb2.FinishWeightUpdateResponse:
        request = rollout_pb2.FinishWeightUpdateRequest(policy_version=policy_version)
        return await self._unary("FinishWeightUpdate", request, timeout)
