"""Clients of a trainer world's TrainerService (`rlcore trainer serve`), blocking and asyncio.

The remote training API: Configure once, then either ForwardBackward (+ OptimStep when a step's
gradients are complete) with a loss of your own choosing, or TrainStep with scored experiences for
one whole RL step; ComputeLogprobs scores sequences without updating anything. Every call has a deadline (ClientOptions.timeout unless `timeout` is given) and is
retried on UNAVAILABLE with backoff; a failure raises RpcError with status and message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.rpc.convert import experience_to_proto
from ..core.types import Experience
from ..proto.v1 import trainer_pb2, trainer_pb2_grpc
from .base import AsyncClient, BlockingClient


@dataclass
class TrainSequence:
    """One training sequence; the loss covers response tokens only."""

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    loss_mask: list[float] = field(default_factory=list)
    """Per response token: 1 trains on it, 0 skips it; empty: all 1."""
    advantages: list[float] = field(default_factory=list)
    """grpo/ppo: one value per response token, or one for the whole sequence."""
    old_logprobs: list[float] = field(default_factory=list)
    """grpo/ppo: log-probs of the response tokens under the policy that sampled them."""


@dataclass
class ForwardBackwardResult:
    loss: float
    """Loss of the batch (normalised as requested)."""
    metrics: dict[str, float]
    """Loss-specific metrics (actor/pg_clipfrac, actor/ppo_kl, sft/loss, ...)."""
    num_tokens: int
    """Tokens the loss covered."""


@dataclass
class OptimStepResult:
    grad_norm: float
    """Global gradient norm before clipping."""
    lr: float
    """Learning rate this step used."""
    global_step: int
    """Optimizer steps taken so far."""


@dataclass
class TrainStepResult:
    metrics: dict[str, float]
    global_step: int


def configure_request(
    config_yaml: str, model_path: str, checkpoint_dir: str, total_steps: int, plan_json: str = ""
) -> trainer_pb2.ConfigureRequest:
    return trainer_pb2.ConfigureRequest(
        config_yaml=config_yaml, model_path=model_path, checkpoint_dir=checkpoint_dir, total_steps=total_steps,
        plan_json=plan_json,
    )  # fmt: skip


def forward_backward_request(
    sequences: Sequence[TrainSequence], loss: str, temperature: float, normalize_tokens: float,
    clip_ratio_low: float | None = None, clip_ratio_high: float | None = None,
) -> trainer_pb2.ForwardBackwardRequest:  # fmt: skip
    return trainer_pb2.ForwardBackwardRequest(
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        sequences=[
            trainer_pb2.TrainSequence(
                prompt_token_ids=s.prompt_token_ids,
                response_token_ids=s.response_token_ids,
                loss_mask=s.loss_mask,
                advantages=s.advantages,
                old_logprobs=s.old_logprobs,
            )  # fmt: skip
            for s in sequences
        ],
        loss=loss,
        temperature=temperature,
        normalize_tokens=normalize_tokens,
    )


def compute_logprobs_request(
    sequences: Sequence[TrainSequence], temperature: float, reference: bool
) -> trainer_pb2.ComputeLogprobsRequest:
    return trainer_pb2.ComputeLogprobsRequest(
        sequences=[
            trainer_pb2.TrainSequence(
                prompt_token_ids=s.prompt_token_ids, response_token_ids=s.response_token_ids
            )
            for s in sequences
        ],
        temperature=temperature,
        reference=reference,
    )


def _logprobs_result(msg: trainer_pb2.ComputeLogprobsResponse) -> list[list[float]]:
    return [list(s.logprobs) for s in msg.sequences]


def _fb_result(msg: trainer_pb2.ForwardBackwardResponse) -> ForwardBackwardResult:
    return ForwardBackwardResult(msg.loss, dict(msg.metrics), msg.num_tokens)


def _optim_result(msg: trainer_pb2.OptimStepResponse) -> OptimStepResult:
    return OptimStepResult(msg.grad_norm, msg.lr, msg.global_step)


def _train_request(experiences: Sequence[Experience]) -> trainer_pb2.TrainStepRequest:
    return trainer_pb2.TrainStepRequest(experiences=[experience_to_proto(e) for e in experiences])


def _train_result(msg: trainer_pb2.TrainStepResponse) -> TrainStepResult:
    return TrainStepResult(dict(msg.metrics), msg.global_step)


class TrainerClient(BlockingClient):
    """Blocking client of a trainer world (its rank 0)."""

    role = "trainer"
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    def configure(
        self,
        config_yaml: str,
        model_path: str = "",
        checkpoint_dir: str = "",
        total_steps: int = 1,
        timeout: float | None = None,
        plan_json: str = "",
    ) -> trainer_pb2.ConfigureResponse:
        """Build (or rebuild) model, optimizer and lr schedule from a complete rlcore config (YAML,
        e.g. `rlcore config show`). Paths are on the trainer's machine; empty model_path means the
        config's model.model_path, empty checkpoint_dir the run folder of the config. `plan_json`:
        the client's plan of the stage, which the service checks against its own."""
        request = configure_request(config_yaml, model_path, checkpoint_dir, total_steps, plan_json)
        return self._unary("Configure", request, timeout)

    def forward_backward(
        self,
        sequences: Sequence[TrainSequence],
        loss: str,
        temperature: float = 1.0,
        normalize_tokens: float = 0.0,
        timeout: float | None = None,
        clip_ratio_low: float | None = None,
        clip_ratio_high: float | None = None,
    ) -> ForwardBackwardResult:
        """Accumulate gradients of `loss` (grpo, ppo, importance_sampling, cispo, gspo, cross_entropy,
        dpo: `sequences` are (chosen, rejected) pairs, pair k at 2k and 2k + 1, on a stage with a
        reference model; or bradley_terry: such pairs on a reward model's stage, a chosen sequence's
        one advantage its pair's margin) over `sequences`; no optimizer step. `normalize_tokens` > 0 divides by that
        many tokens (a step spanning several calls; 1: the sum). `clip_ratio_low/high`: a policy
        loss's clip range [1 - low, 1 + high] (None: the configured one)."""
        request = forward_backward_request(
            sequences, loss, temperature, normalize_tokens, clip_ratio_low, clip_ratio_high
        )
        return _fb_result(self._unary("ForwardBackward", request, timeout))

    def compute_logprobs(
        self,
        sequences: Sequence[TrainSequence],
        temperature: float = 1.0,
        reference: bool = False,
        timeout: float | None = None,
    ) -> list[list[float]]:
        """Per sequence, the log-prob of each response token under the current policy (the reference
        model with `reference=True`), scaled by `temperature`; nothing is updated. Only the
        sequences' token ids are used. On a reward model's stage: each sequence's score, one value."""
        request = compute_logprobs_request(sequences, temperature, reference)
        return _logprobs_result(self._unary("ComputeLogprobs", request, timeout))

    def optim_step(
        self, timeout: float | None = None, adam: dict[str, float] | None = None
    ) -> OptimStepResult:
        """Step on the gradients accumulated so far; `adam` (AdamParams' fields: learning_rate, beta1,
        beta2, eps, weight_decay, grad_clip_norm) in place of the configured optimizer and schedule."""
        request = trainer_pb2.OptimStepRequest(adam=None if adam is None else trainer_pb2.AdamParams(**adam))
        return _optim_result(self._unary("OptimStep", request, timeout))

    def export_weights(self, folder: str, timeout: float | None = None) -> trainer_pb2.ExportWeightsResponse:
        """Write the current weights as an HF folder at `folder` (on the trainer's file system)."""
        return self._unary("ExportWeights", trainer_pb2.ExportWeightsRequest(folder=folder), timeout)

    def train_step(self, experiences: Sequence[Experience], timeout: float | None = None) -> TrainStepResult:
        """One full RL step (log-probs, advantages, the configured mini-batch updates). Gradients a
        ForwardBackward left without an OptimStep join its first update."""
        return _train_result(self._unary("TrainStep", _train_request(experiences), timeout))

    def save_checkpoint(
        self, export_hf: bool = False, explore_step: int = 0, timeout: float | None = None
    ) -> tuple[str, str]:
        """(checkpoint folder, HF export folder or "") on the trainer's file system."""
        request = trainer_pb2.SaveCheckpointRequest(export_hf=export_hf, explore_step=explore_step)
        msg = self._unary("SaveCheckpoint", request, timeout)
        return msg.path, msg.hf_path

    def load_checkpoint(
        self, path: str = "", timeout: float | None = None, weights_only: bool = False
    ) -> trainer_pb2.LoadCheckpointResponse:
        """Restore `path` (empty: the newest checkpoint of the configured checkpoint_dir);
        `weights_only`: the optimizer starts afresh."""
        request = trainer_pb2.LoadCheckpointRequest(path=path, weights_only=weights_only)
        return self._unary("LoadCheckpoint", request, timeout)

    def get_state(self, timeout: float | None = None) -> trainer_pb2.GetStateResponse:
        return self._unary("GetState", trainer_pb2.GetStateRequest(), timeout)

    def sync_weights(
        self, endpoints: Sequence[str], timeout: float | None = None
    ) -> trainer_pb2.SyncWeightsResponse:
        """Push the current weights to these rollout workers (host:port each)."""
        request = trainer_pb2.SyncWeightsRequest(endpoints=list(endpoints))
        return self._unary("SyncWeights", request, timeout)


class AsyncTrainerClient(AsyncClient):
    """asyncio client of a trainer world; the same calls as TrainerClient."""

    role = "trainer"
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    async def configure(
        self,
        config_yaml: str,
        model_path: str = "",
        checkpoint_dir: str = "",
        total_steps: int = 1,
        timeout: float | None = None,
        plan_json: str = "",
    ) -> trainer_pb2.ConfigureResponse:
        request = configure_request(config_yaml, model_path, checkpoint_dir, total_steps, plan_json)
        return await self._unary("Configure", request, timeout)

    async def forward_backward(
        self,
        sequences: Sequence[TrainSequence],
        loss: str,
        temperature: float = 1.0,
        normalize_tokens: float = 0.0,
        timeout: float | None = None,
    ) -> ForwardBackwardResult:
        request = forward_backward_request(sequences, loss, temperature, normalize_tokens)
        return _fb_result(await self._unary("ForwardBackward", request, timeout))

    async def compute_logprobs(
        self,
        sequences: Sequence[TrainSequence],
        temperature: float = 1.0,
        reference: bool = False,
        timeout: float | None = None,
    ) -> list[list[float]]:
        request = compute_logprobs_request(sequences, temperature, reference)
        return _logprobs_result(await self._unary("ComputeLogprobs", request, timeout))

    async def optim_step(self, timeout: float | None = None) -> OptimStepResult:
        return _optim_result(await self._unary("OptimStep", trainer_pb2.OptimStepRequest(), timeout))

    async def train_step(
        self, experiences: Sequence[Experience], timeout: float | None = None
    ) -> TrainStepResult:
        return _train_result(await self._unary("TrainStep", _train_request(experiences), timeout))

    async def save_checkpoint(
        self, export_hf: bool = False, explore_step: int = 0, timeout: float | None = None
    ) -> tuple[str, str]:
        request = trainer_pb2.SaveCheckpointRequest(export_hf=export_hf, explore_step=explore_step)
        msg = await self._unary("SaveCheckpoint", request, timeout)
        return msg.path, msg.hf_path

    async def load_checkpoint(
        self, path: str = "", timeout: float | None = None
    ) -> trainer_pb2.LoadCheckpointResponse:
        return await self._unary("LoadCheckpoint", trainer_pb2.LoadCheckpointRequest(path=path), timeout)

    async def get_state(self, timeout: float | None = None) -> trainer_pb2.GetStateResponse:
        return await self._unary("GetState", trainer_pb2.GetStateRequest(), timeout)

    async def sync_weights(
        self, endpoints: Sequence[str], timeout: float | None = None
    ) -> trainer_pb2.SyncWeightsResponse:
        request = trainer_pb2.SyncWeightsRequest(endpoints=list(endpoints))
        return await self._unary("SyncWeights", request, timeout)
