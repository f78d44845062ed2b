"""The trainer handle: what the loop (loop.py) asks of a trainer world, whichever way it reaches it.

    LocalTrainer    rank 0 of the world this process belongs to, commanding every rank through
                    the command channel (`rlcore launch`, trainer_rank.py)
    RemoteTrainer   a world started elsewhere (`rlcore trainer serve`), over TrainerService
                    (trainer.remote)
    TinkerTrainer   a Tinker service (trainer.remote tinker://..., tinker/trainer.py): the
                    algorithm's step computed here, its updates as Tinker requests

The first two run the same TrainerWorld methods on the trainer's ranks; the loop does not know which.
The last two are RemoteHandles: the launch watches their service (service_watch.py).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import torch

from ..client.base import RpcError
from ..client.trainer import ForwardBackwardResult, OptimStepResult, TrainerClient, TrainSequence
from ..core.config import RLCoreConfig, to_yaml
from ..core.config.plan import StagePlan
from ..core.types import Experience
from ..rollout.explorer import Rollout, engine_in_every_rank
from .colocated import WorldRollout
from .commands import (
    ConfigureCall,
    ForwardBackwardCall,
    LoadCheckpointCall,
    LogprobsCall,
    OptimStepCall,
    PublishWeightsCall,
    SaveCheckpointCall,
    StartEnginesCall,
    SyncWeightsCall,
    TrainStepCall,
)
from .service_watch import lost
from .trainer_world import Commander
from .training import SequenceSpec, sequence_spec


@dataclass
class Restored:
    """A checkpoint the trainer resumed from."""

    path: str
    global_step: int
    explore_step: int


@dataclass
class Engines:
    """A stage's in-process engines, as the explorer uses them."""

    rollout: Rollout
    evaluation: Rollout
    reused: bool
    """Rank 0's engine came from an earlier stage (it holds that stage's weights until a sync)."""


@dataclass
class Synced:
    num_bytes: int
    """Bytes sent (0 where the transport does not count them)."""
    seconds: float


class TrainerHandle(ABC):
    runs_passes: frozenset[str] | None = None
    """The step passes (plan.Passes.names) this trainer runs; None: every one. The config check
    reads the same from plan.TRAINER_PASSES, without importing the trainer."""

    @abstractmethod
    def configure(self, cfg: RLCoreConfig, plan: StagePlan, model_path: str, stage_dir: str, total_steps: int) -> None:
        """Build the model, optimizer and lr schedule of a stage (`cfg`, planned as `plan`)."""

    @abstractmethod
    def train_step(self, experiences: list[Experience]) -> tuple[dict[str, float], int]:
        """One RL step on scored experiences: its metrics and the optimizer steps taken so far."""

    @abstractmethod
    def forward_backward(self, sequences: list[TrainSequence], loss: str) -> ForwardBackwardResult:
        """Accumulate the gradients of `loss` over `sequences` (temperature 1, no optimizer step)."""

    @abstractmethod
    def optim_step(self) -> OptimStepResult: ...

    @abstractmethod
    def compute_logprobs(self, sequences: list[TrainSequence]) -> list[list[float]]:
        """Response log-probs under the current policy (temperature 1)."""

    @abstractmethod
    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        """(checkpoint folder, HF export folder or "")."""

    @abstractmethod
    def load_checkpoint(self) -> Restored | None:
        """Restore the stage's newest checkpoint that verifies (trainer.resume_fallback); None when
        it has none."""

    @abstractmethod
    def sync_weights(self, endpoints: list[str]) -> Synced:
        """Push the weights to the rollout workers at `endpoints` (none: the in-process engines)."""

    def publish_weights(self, folder: str) -> tuple[int, Synced]:
        """Write the weights as the next version in `folder`, for the explorers of a decoupled run
        (mode train); the version written."""
        raise ValueError(
            "a remote trainer does not publish weights for mode explore yet: run mode train with `rlcore launch`"
        )

    def push_weights(self, endpoints: list[str], transport: str, token: str) -> tuple[int, float]:
        """Push the weights to the rollout workers at `endpoints` by `transport` (a decoupled run's
        explorer's workers, plan.explorer_weights, which take their launch's `token`); (the policy
        version they got, seconds)."""
        raise ValueError(
            "a remote trainer does not push weights to an explorer yet: run mode train with `rlcore launch`"
        )

    def start_engines(self, plan: StagePlan) -> Engines:
        """Start the configured stage's engines inside the trainer (plan.engines in_process: mode
        colocate, and evaluation in modes train and bench)."""
        raise ValueError("a remote trainer hosts no engine: its runs explore and evaluate on rollout workers")


class LocalTrainer(TrainerHandle):
    def __init__(self, command: Commander):
        self.command = command

    def configure(self, cfg: RLCoreConfig, plan: StagePlan, model_path: str, stage_dir: str, total_steps: int) -> None:
        self.command(ConfigureCall(cfg, plan, model_path, stage_dir, total_steps))

    def train_step(self, experiences: list[Experience]) -> tuple[dict[str, float], int]:
        out = self.command(TrainStepCall(experiences))
        return out["metrics"], out["global_step"]

    def forward_backward(self, sequences: list[TrainSequence], loss: str) -> ForwardBackwardResult:
        out = self.command(ForwardBackwardCall(_specs(sequences), loss, 1.0, 0.0))
        return ForwardBackwardResult(out["loss"], out["metrics"], out["num_tokens"])

    def optim_step(self) -> OptimStepResult:
        out = self.command(OptimStepCall())
        return OptimStepResult(out["grad_norm"], out["lr"], out["global_step"])

    def compute_logprobs(self, sequences: list[TrainSequence]) -> list[list[float]]:
        return self.command(LogprobsCall(_specs(sequences), 1.0, False))  # type: ignore[no-any-return]

    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        out = self.command(SaveCheckpointCall(export_hf, explore_step))
        return out["path"], out["hf_path"]

    def load_checkpoint(self) -> Restored | None:
        from ..core.checkpoint import resumable_checkpoint

        training = self.command.world.training
        assert training is not None, "configure first"
        path = resumable_checkpoint(training.stage_dir, training.cfg.trainer.resume_fallback)
        if path is None:
            return None
        state = self.command(LoadCheckpointCall(path))
        return Restored(path, state.global_step, state.explore_step)

    def sync_weights(self, endpoints: list[str]) -> Synced:
        out = self.command(SyncWeightsCall(endpoints))
        if "failed" in out:  # raised here, outside the command every rank has finished
            raise RuntimeError(out["failed"])
        return Synced(out["num_bytes"], out["seconds"])

    def push_weights(self, endpoints: list[str], transport: str, token: str) -> tuple[int, float]:
        out = self.command(SyncWeightsCall(endpoints, transport, token))
        if "failed" in out:
            raise RuntimeError(out["failed"])
        return out["policy_version"], out["seconds"]

    def publish_weights(self, folder: str) -> tuple[int, Synced]:
        out = self.command(PublishWeightsCall(folder))
        return out["policy_version"], Synced(out["num_bytes"], out["seconds"])

    def start_engines(self, plan: StagePlan) -> Engines:
        """In rank 0, or in every rank (each generating its share; evaluation on rank 0's)."""
        world = self.command.world
        assert world.training is not None, "configure first"
        every_rank = engine_in_every_rank(world.training.cfg, plan, torch.distributed.get_world_size())
        reused = self.command(StartEnginesCall(every_rank))
        assert world.engine is not None
        return Engines(WorldRollout(self.command) if every_rank else world.engine, world.engine, reused)


class RemoteHandle(TrainerHandle):
    """A trainer world, or a Tinker service, that the launch reaches over the network."""

    peer: str
    """What the launch's lines call the service: "the Tinker service at http://host:port", ..."""

    @abstractmethod
    def answers(self, timeout_s: float) -> bool:
        """Whether the service answers at all within `timeout_s` (busy or not)."""

    @abstractmethod
    def close(self, ok: bool, answering: bool) -> None:
        """The run is over, successful or not (`ok`); `answering`: False when the service stopped
        answering (nothing is waited for there then)."""


class RemoteTrainer(RemoteHandle):
    def __init__(self, client: TrainerClient):
        self.client = client
        self.peer = f"the trainer service (rlcore trainer serve) at {client.address}"

    def answers(self, timeout_s: float) -> bool:
        return self.client.answers(timeout_s)

    def close(self, ok: bool, answering: bool) -> None:
        self.client.close()

    @contextmanager
    def _call(self) -> Iterator[None]:
        """A call the service did not take after its retries (UNAVAILABLE: gone) is a lost service."""
        try:
            yield
        except RpcError as e:
            if e.code != grpc.StatusCode.UNAVAILABLE:
                raise
            raise lost(self.peer, f"{e.method}: {e.details}") from None

    def configure(self, cfg: RLCoreConfig, plan: StagePlan, model_path: str, stage_dir: str, total_steps: int) -> None:
        # the service validates the config and plans the stage again (it answers any client), and
        # refuses a plan that differs from this one
        with self._call():
            self.client.configure(
                to_yaml(cfg), model_path, stage_dir, total_steps, plan_json=json.dumps(plan.as_dict())
            )

    def train_step(self, experiences: list[Experience]) -> tuple[dict[str, float], int]:
        with self._call():
            result = self.client.train_step(experiences)
        return result.metrics, result.global_step

    def forward_backward(self, sequences: list[TrainSequence], loss: str) -> ForwardBackwardResult:
        with self._call():
            return self.client.forward_backward(sequences, loss)

    def optim_step(self) -> OptimStepResult:
        with self._call():
            return self.client.optim_step()

    def compute_logprobs(self, sequences: list[TrainSequence]) -> list[list[float]]:
        with self._call():
            return self.client.compute_logprobs(sequences)

    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        with self._call():
            return self.client.save_checkpoint(export_hf=export_hf, explore_step=explore_step)

    def load_checkpoint(self) -> Restored | None:
        with self._call():
            msg = self.client.load_checkpoint()
        return Restored(msg.path, msg.global_step, msg.explore_step) if msg.path else None

    def sync_weights(self, endpoints: list[str]) -> Synced:
        with self._call():
            msg = self.client.sync_weights(endpoints)
        return Synced(msg.num_bytes, msg.seconds)


def _specs(sequences: list[TrainSequence]) -> list[SequenceSpec]:
    """Sequences the loop built (valid by construction) as the world takes them."""
    return [
        sequence_spec(
            list(s.prompt_token_ids),
            list(s.response_token_ids),
            list(s.loss_mask),
            list(s.advantages),
            list(s.old_logprobs) or None,
        )  # fmt: skip
        for s in sequences
    ]
