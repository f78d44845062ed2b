"""The config schema: every field, its default and its allowed values live here and only here.

YAML recipes in `configs/` hold overrides only. Field metadata drives validation (see validate.py):
  choices       allowed values (a tuple, or "module:REGISTRY" naming a lazy Registry)
  ge/gt/le/lt   numeric bounds
  must_exist    the value is a path that must exist (unless a generator can create it)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .algorithm import (
    ALGORITHM_SECTIONS,
    AlgorithmConfig,
    DpoConfig,
    KLControllerConfig,
    LengthPenaltyConfig,
    MaxEntConfig,
    MixConfig,
    OpmdConfig,
    OptimizerConfig,
    RewardModelConfig,
    RolloutCorrectionConfig,
)
from .buffer import (
    BufferConfig,
    ExperienceBufferConfig,
    ExplorerInput,
    FormatConfig,
    JudgeConfig,
    ReplayBufferConfig,
    RewardModelRewardConfig,
    RolloutArgs,
    TaskSelectionConfig,
    TasksetConfig,
    TrainerInput,
)
from .cluster import ClusterConfig
from .control import MONITOR_TYPES, ControlConfig, LogConfig, MonitorConfig, TLSConfig
from .explorer import DynamicTimeoutConfig, ExplorerConfig, OverRolloutConfig, RolloutModelConfig
from .fields import bounded, choice
from .model import (
    AuxiliaryModelConfig,
    CriticConfig,
    ExternalModelConfig,
    LoraConfig,
    ModelConfig,
    ScratchModelConfig,
)
from .trainer import FsdpConfig, MegatronConfig, SynchronizerConfig, TinkerConfig, TrainerConfig

__all__ = [
    "ALGORITHM_SECTIONS",
    "AlgorithmConfig",
    "DpoConfig",
    "RewardModelConfig",
    "MaxEntConfig",
    "MixConfig",
    "OpmdConfig",
    "AuxiliaryModelConfig",
    "BufferConfig",
    "ClusterConfig",
    "ControlConfig",
    "CriticConfig",
    "DynamicTimeoutConfig",
    "ExperienceBufferConfig",
    "ExplorerConfig",
    "ExplorerInput",
    "TaskSelectionConfig",
    "ExternalModelConfig",
    "FormatConfig",
    "KLControllerConfig",
    "LengthPenaltyConfig",
    "RolloutCorrectionConfig",
    "LogConfig",
    "LoraConfig",
    "MONITOR_TYPES",
    "MegatronConfig",
    "FsdpConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "OverRolloutConfig",
    "RLCoreConfig",
    "ReplayBufferConfig",
    "RolloutArgs",
    "RolloutModelConfig",
    "STAGE_SECTIONS",
    "ScratchModelConfig",
    "SynchronizerConfig",
    "TLSConfig",
    "JudgeConfig",
    "RewardModelRewardConfig",
    "TasksetConfig",
    "TinkerConfig",
    "TrainerConfig",
    "TrainerInput",
    "bounded",
    "choice",
]


@dataclass
class RLCoreConfig:
    project: str = "rlcore"
    """The project: runs live in <checkpoint_root_dir>/<project>/<name>/ (monitors group runs by it too)."""
    name: str = "run"
    """The run's name within the project; a second run needs a new one (rlcore refuses to overwrite a run)."""
    mode: str = choice("both", ("both", "colocate", "train", "explore", "bench"))
    """both: explore on rollout workers (separate processes, spawned or at explorer.rollout_model.
    endpoints) and train in turn; colocate: the engine lives in trainer rank 0's process; train: SFT
    or DPO on the taskset's rows, or an RL algorithm on the experiences a mode-explore launch writes
    to buffer.trainer_input.experience_buffer (publishing its weights for it); explore: rollout
    workers only, writing experiences to that buffer and loading the weights the trainer publishes;
    bench: evaluate the model on the eval tasksets only."""
    checkpoint_root_dir: str = "./checkpoints"
    """Runs live in <checkpoint_root_dir>/<project>/<name>/."""
    continue_from_checkpoint: bool = False
    """Resume from the latest checkpoint of this run (stages already finished are skipped)."""
    seed: int = 42
    """Seeds the run's random draws (model init, shuffling, sampling): a run and its resume draw the same."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    explorer: ExplorerConfig = field(default_factory=ExplorerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    synchronizer: SynchronizerConfig = field(default_factory=SynchronizerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    log: LogConfig = field(default_factory=LogConfig)
    stages: list[Any] = field(default_factory=list)
    """Sequential stages; each is {name: ..., <section>: {overrides}} applied on top of this config."""


# sections a stage may override (everything but the run identity and the stage list itself)
STAGE_SECTIONS = (
    "mode", "algorithm", "model", "buffer", "explorer", "trainer", "critic", "synchronizer", "monitor"
)  # fmt: skip
