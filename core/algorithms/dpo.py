"""DPO (Rafailov et al. 2023, "Direct Preference Optimization", arXiv:2305.18290), with the label
smoothing of conservative DPO (Mitchell 2023): for a prompt x with a chosen response y_w and a
rejected one y_l,

    z = beta * [(log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x))]
    L = -(1 - eps) * log sigmoid(z) - eps * log sigmoid(-z),    averaged over the P pairs,

log pi(y|x) being the sum of the response's token log-probs (algorithm.dpo.beta, algorithm.dpo.label_smoothing).
With algorithm.dpo.nll_coef = alpha > 0 the chosen responses' negative log-likelihood is added, as
in RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization", arXiv:2404.19733): plain
DPO can lower the chosen responses' likelihood along with the rejected ones' (the margin grows
while both fall), and the NLL term holds it up. RPO's equation normalises each pair's NLL by its own
chosen length and averages over pairs,

    L_NLL = (1/P) sum_p -log pi(y_w^p|x^p) / |y_w^p|          (algorithm.dpo.nll_norm: pair, default)

while TRL's rpo_alpha divides the chosen responses' summed NLL by all their tokens together
(algorithm.dpo.nll_norm: batch_tokens): the two agree when every chosen response has the same length.

How rlcore trains it: pairs need not share a micro-batch or a rank. A first pass (no gradients)
scores every response under the policy and the reference and gives each pair its dL/dz; then
gradients come from the surrogate  S = sum_y w_y * log pi(y|x)  with  w_{y_w} = dL/dz * beta / P and
w_{y_l} = -w_{y_w}, whose gradient at these weights is exactly DPO's (S's value is not the loss:
the loss is reported from the first pass). That is a per-token loss like every other, so every
strategy, micro-batching and data-parallel split trains DPO unchanged, for one extra forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class DPOPairs:
    loss: float
    """The batch's DPO loss (mean over pairs)."""
    weights: torch.Tensor
    """[2P] the surrogate's weight of each response, chosen and rejected alternating."""
    metrics: dict[str, float]


def dpo_pairs(
    policy: torch.Tensor,
    reference: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    nll_coef: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    nll_norm: str = "pair",
) -> DPOPairs:
    """`policy`, `reference`: [2P] summed response log-probs, (chosen, rejected) alternating;
    `chosen_lengths`: [P] the trained tokens of each chosen response (the NLL term's normaliser,
    per pair or over the batch by `nll_norm`; None: 1 each)."""
    assert policy.shape == reference.shape and policy.numel() % 2 == 0, "pairs: chosen, rejected, ..."
    assert nll_norm in ("pair", "batch_tokens"), nll_norm
    delta = (policy - reference).double()
    chosen, rejected = delta[0::2], delta[1::2]
    z = beta * (chosen - rejected)
    eps = label_smoothing
    losses = -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)
    dl_dz = -(1 - eps) * torch.sigmoid(-z) + eps * torch.sigmoid(z)
    pairs = z.numel()
    w = dl_dz * beta / pairs
    lengths = torch.ones(pairs, dtype=torch.float64) if chosen_lengths is None else chosen_lengths.double()
    lengths = lengths.clamp(min=1.0)
    # d(nll)/d(log pi(y_w^p)): -1 / (P |y_w^p|) per pair, or -1 / (all chosen tokens) over the batch
    per_chosen = 1.0 / (pairs * lengths) if nll_norm == "pair" else torch.ones_like(lengths) / lengths.sum()
    nll = -(policy[0::2].double() * per_chosen).sum()
    weights = torch.stack([w - nll_coef * per_chosen, -w], dim=1).reshape(-1).float()
    metrics = {
        "dpo/loss": float(losses.mean() + nll_coef * nll),
        "dpo/pair_loss": float(losses.mean()),
        "dpo/chosen_nll": float(nll),
        "dpo/accuracy": float((z > 0).double().mean()),
        "dpo/margin": float((z / beta).mean()),
        "dpo/chosen_reward": float(beta * chosen.mean()),
        "dpo/rejected_reward": float(beta * rejected.mean()),
    }
    return DPOPairs(metrics["dpo/loss"], weights, metrics)


class SequenceSurrogate:
    """The `LossFn` (backends/base.py) of the surrogate: sum over tokens of weight * log-prob (DPO)
    or weight * score (a reward model's head, reward_model.py, fed where log-probs are), the weight
    of each response's tokens standing in `advantages`; reported as `metric`."""

    needs_entropy = False
    needs_reference = False

    def __init__(self, metric: str = "dpo/surrogate"):
        self.metric = metric

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        surrogate = (batch["advantages"] * logprobs * batch["loss_mask"]).sum()
        return surrogate, {self.metric: float(surrogate.detach())}


def best_and_worst(group: list[Any]) -> list[Any] | None:
    """A task's group of scored experiences as a DPO pair [chosen, rejected]: its highest and lowest
    reward (the first of equals, in group order); None when every reward ties (no preference) or the
    two responses are the same tokens (algorithm.dpo.pairs buffer)."""
    chosen = max(group, key=lambda e: e.reward)
    rejected = min(group, key=lambda e: e.reward)
    if chosen.reward == rejected.reward or chosen.response_token_ids == rejected.response_token_ids:
        return None
    return [chosen, rejected]
