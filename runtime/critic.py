"""The critic of algorithm_type ppo, as every trainer rank holds it: a second strategy of the same
kind as the policy's (trainer.strategy), built with a value head from model.critic_model_path, its
own optimizer (critic.optim) and lr schedule, and the clipped value loss (core/algorithms/ppo.py).

It works on the policy's micro-batches: `score` writes its values into them before the advantages
are computed (`values`), `update` trains on the returns the trainer wrote beside them (`returns`).
Checkpoints keep it in the policy checkpoint's `critic/` folder.
"""

from __future__ import annotations

import os

from ..backends import STRATEGIES
from ..backends.base import TrainingStrategy
from ..core.algorithms.aggregation import LossNorm
from ..core.algorithms.ppo import ValueLoss
from ..core.batch import Batch
from ..core.config import RLCoreConfig

CRITIC_DIR = "critic"
"""The critic's sub-folder of a checkpoint's model/ folder."""


class Critic:
    def __init__(self, cfg: RLCoreConfig, model_path: str, device: str, total_steps: int):
        self.cfg = cfg.critic
        self.strategy = STRATEGIES.resolve(cfg.trainer.strategy)(
            cfg.model.critic_model_path or model_path, cfg.trainer, cfg.critic.optim, device=device,
            dtype=cfg.model.dtype, total_steps=total_steps, with_reference=False, seed=cfg.seed, value_head=True,
        )  # fmt: skip

    def score(self, mbs: list[Batch]) -> None:
        """Write the critic's values of every position into each micro-batch (`values`)."""
        for mb, values in zip(mbs, self.strategy.compute_values(mbs), strict=True):
            mb["values"] = values

    def update(self, mbs: list[Batch], norm: LossNorm) -> dict[str, float]:
        """One optimizer step of the value loss on the micro-batches' `returns`."""
        metrics = self.strategy.forward_backward(mbs, ValueLoss(self.cfg.cliprange_value, norm), 1.0)
        metrics["critic/lr"] = self.strategy.current_lr()
        metrics["critic/grad_norm"] = self.strategy.optimizer_step()
        return metrics


class WithCritic:
    """What a checkpoint's model/ folder holds when a critic trains: the policy's state, and the
    critic's in `critic/` (the `save_checkpoint`/`load_checkpoint` half of TrainingStrategy)."""

    def __init__(self, policy: TrainingStrategy, critic: Critic):
        self.policy, self.critic = policy, critic

    def save_checkpoint(self, path: str) -> None:
        self.policy.save_checkpoint(path)
        self.critic.strategy.save_checkpoint(os.path.join(path, CRITIC_DIR))

    def load_checkpoint(self, path: str) -> None:
        self.policy.load_checkpoint(path)
        critic_dir = os.path.join(path, CRITIC_DIR)
        if not os.path.isdir(critic_dir):
            raise ValueError(
                f"checkpoint {os.path.dirname(path)} holds no critic (no {CRITIC_DIR}/): it was written by "
                "a stage without one; resume with the algorithm_type that wrote it"
            )
        self.critic.strategy.load_checkpoint(critic_dir)
