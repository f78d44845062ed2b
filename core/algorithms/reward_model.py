"""Reward-model training: a Bradley-Terry loss on (chosen, rejected) pairs (Bradley & Terry 1952; as
InstructGPT trains its reward model, Ouyang et al. 2022, arXiv:2203.02155). The model is the
policy's trunk with a scalar head; its score r(x, y) of a prompt and response is the head's output
at the response's last token. For P pairs,

    L = (1/P) sum_p -log sigmoid(r(x, y_w) - r(x, y_l) - m_p)  +  c * (1/P) sum_p (r(x, y_w) + r(x, y_l))^2

with m_p the pair's margin (Llama 2's, Touvron et al. 2023, arXiv:2307.09288: how much better the
chosen response is, from the taskset column algorithm.reward_model.margin_key; 0 without one) and
c = algorithm.reward_model.center_coef (TRL's center_rewards_coefficient, Eisenstein et al. 2023:
the scores' scale is otherwise free, and the term keeps them centred on 0).

How rlcore trains it: as DPO (dpo.py), pairs need not share a micro-batch or a rank. A first pass
(no gradients) scores every response and gives each pair dL/dr of its two scores; gradients come
from the surrogate  S = sum_y w_y * r(x, y)  with those weights (`SequenceSurrogate`, fed the
head's outputs in place of log-probs), whose gradient is exactly the loss's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class RewardPairs:
    loss: float
    """The batch's loss (mean over pairs, with the centring term)."""
    weights: torch.Tensor
    """[2P] the surrogate's weight of each response's score, chosen and rejected alternating."""
    metrics: dict[str, float]


def bradley_terry_pairs(scores: torch.Tensor, margins: torch.Tensor | None = None, center_coef: float = 0.0) -> RewardPairs:
    """`scores`: [2P] each response's score, (chosen, rejected) alternating; `margins`: [P] each
    pair's margin (None: 0)."""
    assert scores.dim() == 1 and scores.numel() % 2 == 0, "pairs: chosen, rejected, ..."
    s = scores.double()
    chosen, rejected = s[0::2], s[1::2]
    pairs = chosen.numel()
    m = torch.zeros(pairs, dtype=torch.float64) if margins is None else margins.double()
    z = chosen - rejected - m
    losses = -F.logsigmoid(z)
    dl_dz = -torch.sigmoid(-z) / pairs
    total = chosen + rejected
    center = center_coef * total.square().mean()
    dc = 2.0 * center_coef * total / pairs  # d(center)/d(r_w) = d(center)/d(r_l)
    weights = torch.stack([dl_dz + dc, -dl_dz + dc], dim=1).reshape(-1).float()
    metrics = {
        "reward_model/loss": float(losses.mean() + center),
        "reward_model/pair_loss": float(losses.mean()),
        "reward_model/accuracy": float((chosen > rejected).double().mean()),
        "reward_model/margin": float((chosen - rejected).mean()),
        "reward_model/chosen_score": float(chosen.mean()),
        "reward_model/rejected_score": float(rejected.mean()),
    }
    return RewardPairs(metrics["reward_model/loss"], weights, metrics)


def pair_metrics(scores: list[float], prefix: str) -> dict[str, float]:
    """Held-out metrics of [2P] scores, (chosen, rejected) alternating: pair accuracy (ties count as
    wrong), mean margin and loss, under `prefix` (e.g. eval/<taskset>/)."""
    pairs = bradley_terry_pairs(torch.tensor(scores, dtype=torch.float64))
    m = pairs.metrics
    return {
        f"{prefix}pair_accuracy": m["reward_model/accuracy"],
        f"{prefix}margin": m["reward_model/margin"],
        f"{prefix}loss": m["reward_model/pair_loss"],
        f"{prefix}pairs": float(len(scores) // 2),
    }
