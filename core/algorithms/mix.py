"""MIX, as Trinity-RFT defines it (Pan et al. 2025, "Trinity-RFT", arXiv:2505.17826; its algorithm
development guide): one optimizer step on both the explored rollouts and expert demonstrations,

    J_mix = (1 - mu) * J_GRPO(rollouts) + mu * (1/B') sum_b (1/T'_b) sum_t log pi(o'_{b,t} | q'_b, o'_{b,<t}),

the expert part being the likelihood of expert responses (buffer.expert_taskset). rlcore takes the
policy part with the configured policy loss and aggregation, and the expert part as the mean NLL
over the step's expert tokens (Trinity's token-level SFT loss). A train batch holds
algorithm.mix_expert_ratio expert rows (Trinity's expert_data_ratio): ceil(r / (1 - r)) expert rows
per rollout, added to the rollouts rather than taking their place, so the explored samples per
step stay those of the other algorithms.
"""

from __future__ import annotations

import math

import torch

from .losses import Batch, PolicyLoss, SFTLoss

EXPERT = "expert"
"""The micro-batch field that marks the expert rows' micro-batches (all ones there)."""


def expert_rows_per_step(rollouts: int, ratio: float) -> int:
    """How many expert rows join `rollouts` explored ones so they make `ratio` of the train batch."""
    return math.ceil(rollouts * ratio / (1.0 - ratio))


class MixLoss:
    """The `LossFn` of a mixed step: (1 - mu) x the policy loss on rollout micro-batches, mu x the NLL
    on expert micro-batches (each normalised over its own part of the batch)."""

    def __init__(self, policy: PolicyLoss, expert: SFTLoss, mu: float):
        self.policy, self.expert, self.mu = policy, expert, mu
        self.needs_entropy = policy.needs_entropy

    @property
    def needs_reference(self) -> bool:
        return self.policy.needs_reference

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if EXPERT in batch:
            loss, metrics = self.expert(logprobs, None, batch)
            return self.mu * loss, {"mix/expert_nll": metrics["sft/loss"]}
        loss, metrics = self.policy(logprobs, entropy, batch)
        return (1.0 - self.mu) * loss, metrics
