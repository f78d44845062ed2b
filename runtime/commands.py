"""The trainer world's commands: one call type per TrainerWorld method. Rank 0 broadcasts a call
(validated, plain Python, pickled by broadcast_object_list) on the command channel and every rank
runs the method its type names (trainer_world.METHODS), so a reader and mypy can follow each one
from the handle that sends it to the method that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..backends.base import AdamHparams
from ..core.config import RLCoreConfig
from ..core.config.plan import StagePlan
from ..core.types import Experience, SamplingParams, Task, WorkflowSpec
from .training import SequenceSpec


@dataclass
class ConfigureCall:
    """Build a stage's model, optimizer and lr schedule (and its weight transport, by its plan)."""

    cfg: RLCoreConfig
    plan: StagePlan
    model_path: str
    checkpoint_dir: str
    total_steps: int


@dataclass
class StartEnginesCall:
    """Build the stage's in-process engine in rank 0, or in every rank."""

    every_rank: bool


@dataclass
class ForwardBackwardCall:
    sequences: list[SequenceSpec]
    loss: str
    temperature: float
    normalize_tokens: float
    clip: tuple[float | None, float | None] = (None, None)
    """Policy losses: (clip_ratio_low, clip_ratio_high) in place of the configured ones (None: the
    configured one)."""


@dataclass
class LogprobsCall:
    sequences: list[SequenceSpec]
    temperature: float
    reference: bool


@dataclass
class OptimStepCall:
    """Step the optimizer on the gradients accumulated so far (with `adam`'s hyperparameters in
    place of the configured optimizer's and schedule's, when given)."""

    adam: AdamHparams | None = None


@dataclass
class TrainStepCall:
    """One RL step on scored experiences."""

    experiences: list[Experience]


@dataclass
class SaveCheckpointCall:
    export_hf: bool
    explore_step: int


@dataclass
class LoadCheckpointCall:
    path: str
    weights_only: bool = False
    """The optimizer starts afresh (its moments and step counts dropped)."""


@dataclass
class SyncWeightsCall:
    endpoints: list[str]
    """The rollout workers to push to; empty: the stage's in-process engines."""
    transport: str = ""
    """A transport of rlcore.weights.TRANSPORTS; empty: the stage's (plan.weights). A decoupled run's
    trainer pushes to its explorer's workers by nccl (plan.explorer_weights)."""
    token: str = ""
    """The workers' token where they are another launch's (a decoupled run's explorer); "": the run's."""


@dataclass
class PublishWeightsCall:
    folder: str


@dataclass
class ExportWeightsCall:
    """Write the current weights as an HF folder (rank 0 writes) at `folder`."""

    folder: str


@dataclass
class RolloutCall:
    """A batch for the engines in every rank: each rank generates its contiguous share."""

    tasks: list[Task]
    sampling: SamplingParams
    spec: WorkflowSpec
    timeout: float


@dataclass
class ProbeCall:
    prompt: list[int]
    max_tokens: int


@dataclass
class ShutdownCall:
    """Release the ranks that follow the channel (the end of the run, or of a service)."""


Command = Union[  # noqa: UP007 (a runtime alias)
    ConfigureCall, StartEnginesCall, ForwardBackwardCall, LogprobsCall, OptimStepCall, TrainStepCall,
    SaveCheckpointCall, LoadCheckpointCall, SyncWeightsCall, PublishWeightsCall, ExportWeightsCall, RolloutCall,
    ProbeCall, ShutdownCall,
]  # fmt: skip
