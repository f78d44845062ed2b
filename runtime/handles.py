"""The trainer handle: what the loop (loop.py) asks of a trainer world, whichever way it reaches it.

    LocalTrainer    rank 0 of the world this process belongs to, commanding every rank through
                    the command channel (`rlcore launch`, trainer_rank.py)
    RemoteTrainer   a world started elsewhere (`rlcore trainer serve`), over TrainerService
                    (trainer.remote)

Both run the same TrainerWorld methods on the trainer's ranks; the loop does not know which.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..client.trainer import ForwardBackwardResult, OptimStepResult, TrainerClient, TrainSequence
from ..core.config import RLCoreConfig, to_yaml
from ..core.types import Experience
from ..rollout.explorer import Rollout
from .colocated import WorldRollout
from .trainer_world import (
    ENGINES_EVERY_RANK,
    ENGINES_NONE,
    Commander,
    ConfigureCall,
    ForwardBackwardCall,
    LogprobsCall,
)
from .training import SequenceSpec


@dataclass
class Restored:
    """A checkpoint the trainer resumed from."""

    path: str
    global_step: int
    explore_step: int


@dataclass
class Synced:
    policy_version: int
    """The version the engines were told (grows over their lifetime)."""
    num_bytes: int
    """Bytes sent (0 where the transport does not count them)."""
    seconds: float


class TrainerHandle(ABC):
    @abstractmethod
    def configure(
        self, cfg: RLCoreConfig, model_path: str, stage_dir: str, total_steps: int, engines: str
    ) -> None:
        """Build the model, optimizer and lr schedule of a stage (and, locally, its in-process
        engines: `engines` is one of trainer_world's ENGINES_*)."""

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
        """Restore the stage's newest checkpoint; None when it has none."""

    @abstractmethod
    def sync_weights(self, endpoints: list[str]) -> Synced:
        """Push the weights to the rollout workers at `endpoints` (none: the in-process engines)."""

    def engines(self) -> tuple[Rollout, Rollout] | None:
        """(rollout, evaluation rollout) on the stage's in-process engines; None without any."""
        return None

    @property
    def engine_reused(self) -> bool:
        """Whether the in-process engine came from an earlier stage (holding that stage's weights)."""
        return False


class LocalTrainer(TrainerHandle):
    def __init__(self, command: Commander):
        self.command = command
        self._engines = ENGINES_NONE

    def configure(
        self, cfg: RLCoreConfig, model_path: str, stage_dir: str, total_steps: int, engines: str
    ) -> None:
        self._engines = engines
        self.command("configure", ConfigureCall(cfg, model_path, stage_dir, total_steps, engines))

    def train_step(self, experiences: list[Experience]) -> tuple[dict[str, float], int]:
        out = self.command("train_step", experiences)
        return out["metrics"], out["global_step"]

    def forward_backward(self, sequences: list[TrainSequence], loss: str) -> ForwardBackwardResult:
        out = self.command("forward_backward", ForwardBackwardCall(_specs(sequences), loss, 1.0, 0.0))
        return ForwardBackwardResult(out["loss"], out["metrics"], out["num_tokens"])

    def optim_step(self) -> OptimStepResult:
        out = self.command("optim_step")
        return OptimStepResult(out["grad_norm"], out["lr"], out["global_step"])

    def compute_logprobs(self, sequences: list[TrainSequence]) -> list[list[float]]:
        return self.command("compute_logprobs", LogprobsCall(_specs(sequences), 1.0, False))  # type: ignore[no-any-return]

    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        out = self.command("save_checkpoint", (export_hf, explore_step))
        return out["path"], out["hf_path"]

    def load_checkpoint(self) -> Restored | None:
        from ..core.checkpoint import latest_checkpoint

        training = self.command.world.training
        assert training is not None, "configure first"
        path = latest_checkpoint(training.stage_dir)
        if path is None:
            return None
        state = self.command("load_checkpoint", path)
        return Restored(path, state.global_step, state.explore_step)

    def sync_weights(self, endpoints: list[str]) -> Synced:
        out = self.command("sync_weights", endpoints)
        return Synced(out["policy_version"], out["num_bytes"], out["seconds"])

    def engines(self) -> tuple[Rollout, Rollout] | None:
        engine = self.command.world.engine
        if engine is None:
            return None
        if self._engines == ENGINES_EVERY_RANK:
            return WorldRollout(self.command), engine
        return engine, engine

    @property
    def engine_reused(self) -> bool:
        return self.command.world.engine_reused


class RemoteTrainer(TrainerHandle):
    def __init__(self, client: TrainerClient):
        self.client = client

    def configure(
        self, cfg: RLCoreConfig, model_path: str, stage_dir: str, total_steps: int, engines: str
    ) -> None:
        assert engines == ENGINES_NONE, "a remote trainer hosts no engine: it explores on rollout workers"
        self.client.configure(to_yaml(cfg), model_path, stage_dir, total_steps)

    def train_step(self, experiences: list[Experience]) -> tuple[dict[str, float], int]:
        result = self.client.train_step(experiences)
        return result.metrics, result.global_step

    def forward_backward(self, sequences: list[TrainSequence], loss: str) -> ForwardBackwardResult:
        return self.client.forward_backward(sequences, loss)

    def optim_step(self) -> OptimStepResult:
        return self.client.optim_step()

    def compute_logprobs(self, sequences: list[TrainSequence]) -> list[list[float]]:
        return self.client.compute_logprobs(sequences)

    def save_checkpoint(self, export_hf: bool, explore_step: int) -> tuple[str, str]:
        return self.client.save_checkpoint(export_hf=export_hf, explore_step=explore_step)

    def load_checkpoint(self) -> Restored | None:
        msg = self.client.load_checkpoint()
        return Restored(msg.path, msg.global_step, msg.explore_step) if msg.path else None

    def sync_weights(self, endpoints: list[str]) -> Synced:
        msg = self.client.sync_weights(endpoints)
        return Synced(msg.policy_version, msg.num_bytes, msg.seconds)


def _specs(sequences: list[TrainSequence]) -> list[SequenceSpec]:
    """Sequences the loop built (valid by construction) as the world takes them: an empty loss
    mask trains on every response token; nothing predicts a first token without a prompt."""
    specs = []
    for s in sequences:
        n = len(s.response_token_ids)
        mask = list(s.loss_mask) or [1.0] * n
        if not s.prompt_token_ids:
            mask[0] = 0.0
        advantages = list(s.advantages) or [0.0] * n
        if len(advantages) == 1:
            advantages = advantages * n
        specs.append(
            SequenceSpec(
                list(s.prompt_token_ids), list(s.response_token_ids), mask, advantages,
                list(s.old_logprobs) or None,
            )  # fmt: skip
        )
    return specs
