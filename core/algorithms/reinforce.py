"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models", arXiv:2501.03262): no critic and no group baseline; the advantage of a token is its
discounted return, normalised over every trained token of the batch,

    r_t = -beta * KL_t (+ the task reward on the last token),  G_t = sum_{k>=t} gamma^(k-t) r_k,
    A_t = (G_t - mean(G)) / (std(G) + eps)   over the batch's trained tokens,

with the KL to the reference model inside the reward (use_kl_in_reward; beta = kl_ctrl.kl_coef).

Its group-baseline form (`reinforce_plus_plus_baseline`, for reasoning tasks with several samples
per prompt) subtracts the group mean from each reward, then normalises over every trained token of
the batch, as the paper (its Algorithm 1), verl and OpenRLHF do,

    a_i = r_i - mean(r_group),   A_{i,t} = (a_i - mean_tokens(a)) / (std_tokens(a) + eps),

the mean and (unbiased) std taken over the batch's trained tokens, response i's a_i counting once per
token: so the advantage scale does not depend on how spread one group's rewards are (GRPO's per-group
std does), and a long response weighs its share. Rewards [1,0,0,0 | 1,1,0,1] with lengths
[2,10,10,10 | 3,3,10,4] give [2.61, -0.10, -0.10, -0.10, 1.25, 1.25, -1.46, 1.25]. The form that
counts each response once (A_i = (a_i - mean(a)) / (std(a) + eps) over responses: [1.62, -0.54, ...])
is advantage_fn `reinforce_plus_plus_baseline_per_response`."""

from __future__ import annotations

import torch

from .grpo import group_centred
from .scored import ScoredBatch


def reinforce_plus_plus_advantages(batch: ScoredBatch, eps: float = 1e-6) -> torch.Tensor:
    """[N, T] whitened discounted returns of the token rewards (module docstring)."""
    mask = batch.need("response_mask", "reinforce_plus_plus")
    gamma = 1.0 if batch.cfg is None else batch.cfg.gamma
    rewards = batch.token_rewards().double()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    step = mask > 0  # a multi-turn response's context tokens are passed over, as in GAE
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(step[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return whiten_tokens(returns, mask, eps).to(mask.dtype)


def whiten_tokens(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(values - mean) / (std + eps) over the tokens where `mask` is 1 (unbiased std, in float64),
    0 elsewhere; all 0 with fewer than two such tokens."""
    m = mask.double()
    count = m.sum()
    if count < 2:
        return torch.zeros_like(m)
    values = values.double()
    mean = (values * m).sum() / count
    std = (((values - mean) * m).square().sum() / (count - 1)).sqrt()
    return (values - mean) / (std + eps) * m


def reinforce_plus_plus_baseline_advantages(batch: ScoredBatch, eps: float = 1e-6) -> torch.Tensor:
    """[N, T] group-centred rewards whitened over the batch's trained tokens (module docstring)."""
    mask = batch.need("response_mask", "reinforce_plus_plus_baseline")
    centred, _, _ = group_centred(batch.rewards, batch.group_ids)
    return whiten_tokens(centred.double().unsqueeze(1) * mask, mask, eps).to(mask.dtype)


def reinforce_plus_plus_baseline_per_response_advantages(
    batch: ScoredBatch, eps: float = 1e-6
) -> torch.Tensor:
    """[N] group-centred rewards whitened over responses, each counting once."""
    rewards = batch.rewards
    centred, _, _ = group_centred(rewards, batch.group_ids)
    if centred.numel() < 2:
        return torch.zeros_like(rewards)
    return ((centred - centred.mean()) / (centred.std() + eps)).to(rewards.dtype)
