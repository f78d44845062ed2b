"""What an advantage function sees of one explore step's experiences: `ScoredBatch`.

Every registered advantage function (ADVANTAGE_FNS) is `fn(batch: ScoredBatch) -> Tensor`, one
advantage per response ([N], broadcast over its trained tokens) or one per token ([N, T]). Per-token
fields are response-aligned: column t is the response's t-th token, whatever the prompt's length.
Fields an algorithm does not need (its preset declares the passes) are None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ScoredBatch:
    rewards: torch.Tensor
    """[N] the task reward of each response, less the sequence's KL penalty with use_kl_in_reward."""
    group_ids: Sequence[str]
    """Responses to the same task share a group id."""
    scores: torch.Tensor | None = None
    """[N] the task reward alone (None: `rewards` is it)."""
    response_mask: torch.Tensor | None = None
    """[N, T] 1.0 on the response tokens that train, 0.0 on the rest and on padding."""
    token_penalty: torch.Tensor | None = None
    """[N, T] kl_coef * KL of each response token (use_kl_in_reward), else None."""
    ref_logprobs: torch.Tensor | None = None
    """[N, T] log-probs of the response tokens under the reference model (presets that need them)."""
    values: torch.Tensor | None = None
    """[N, T] the critic's value of the state before each response token (ppo), else None."""
    cfg: Any = None
    """The stage's AlgorithmConfig, preset filled (gamma, maxent knobs, ...)."""
    episode_ids: Sequence[str] | None = None
    """Each response's Experience.episode_id (samples of one episode share it; empty: a whole
    episode), None when none was split: episodes.py counts each episode once."""

    def __post_init__(self) -> None:
        assert self.rewards.dim() == 1 and len(self.group_ids) == self.rewards.shape[0], (
            "one group id per reward"
        )

    def need(self, name: str, algorithm: str) -> torch.Tensor:
        """A per-token field the algorithm cannot do without."""
        value = getattr(self, name)
        assert value is not None, f"{algorithm} needs {name} (its preset declares the pass)"
        return value  # type: ignore[no-any-return]

    def token_rewards(self) -> torch.Tensor:
        """[N, T] the reward as tokens earn it: the task reward on each response's last trained
        token, less the KL penalty on every token (none without use_kl_in_reward)."""
        mask = self.need("response_mask", "a token-level advantage")
        out = torch.zeros_like(mask) if self.token_penalty is None else -self.token_penalty * mask
        has_token = mask.sum(-1) > 0
        last = (mask * torch.arange(1, mask.shape[1] + 1, dtype=mask.dtype)).argmax(-1)
        rows = torch.arange(mask.shape[0])[has_token]
        scores = self.rewards if self.scores is None else self.scores
        out[rows, last[has_token]] += scores[has_token].to(out.dtype)
        return out
