"""MaxEnt-GRPO (github.com/liv-daliberti/maxent-grpo): each group's responses are weighted by a
listwise target, the maximum-entropy policy over the group's candidates blended with the
reference model's, and the policy is trained by likelihood under those weights,

    q_i = normalise( softmax_i(r_i / T) * (1 - eps K) + eps )          T = maxent_grpo.q_temperature,
                                                                        eps = maxent_grpo.q_epsilon
    s_i = log pi_ref(y_i)  (divided by |y_i| with maxent_grpo.length_normalize_ref)
    w_i = softmax_i( (log q_i + beta s_i) / (tau + beta) )   i.e.  pi* ∝ q^(1/(tau+beta)) pi_ref^(beta/(tau+beta))
    loss = mean_groups( -sum_i w_i * mean_t log pi(y_i,t) )

tau = algorithm.maxent_grpo.tau, beta = kl_loss_coef (its KL loss term applies too when kl_loss_fn is set). The
weights are constants (no gradient). Here the advantage of response i is K w_i, so that with the
`weighted_likelihood` loss and seq-mean-token-mean the batch loss is the mean over groups above.
A group that cannot rank its responses (one response, or all rewards equal so q is uniform) is
left out (weight 0), as the repository's default (skip zero-variance groups) does.

Normalisation: the smoothing q (1 - eps K) + eps (every candidate keeps at least eps, the total
stays 1) and the per-group sum of w_i times each response's token mean are the repository's code;
its write-up states the target without the smoothing."""

from __future__ import annotations

import torch

from ..config.schema import AlgorithmConfig
from .grpo import group_centred, group_max, group_sum
from .scored import ScoredBatch


def maxent_advantages(batch: ScoredBatch) -> torch.Tensor:
    """[N] K w_i of each response (module docstring)."""
    cfg = batch.cfg
    assert cfg is not None, "maxent_grpo reads its knobs from the algorithm config"
    r = batch.rewards.double()
    centred, count_N, group_N = group_centred(r, batch.group_ids)
    q = _group_softmax(r / max(cfg.maxent_grpo.q_temperature, 1e-8), group_N)
    eps = min(cfg.maxent_grpo.q_epsilon, 1.0 / float(count_N.max()) - 1e-8)
    q = q * (1.0 - eps * count_N) + eps
    q = q / group_sum(q, group_N)
    beta, tau = cfg.kl_loss_coef, cfg.maxent_grpo.tau
    logits = q.log()
    if beta > 0:
        ref = batch.need("ref_logprobs", "maxent_grpo with kl_loss_coef > 0").double()
        mask = batch.need("response_mask", "maxent_grpo").double()
        s = (ref * mask).sum(-1)
        if cfg.maxent_grpo.length_normalize_ref:
            s = s / mask.sum(-1).clamp(min=1)
        logits = logits + beta * s
    w = _group_softmax(logits / (tau + beta), group_N)
    spread = group_sum(centred.square(), group_N)  # 0 exactly when the group's rewards are all equal
    ranks = (count_N > 1) & (spread > 0)
    return torch.where(ranks, count_N * w, torch.zeros_like(w)).to(batch.rewards.dtype)


def weighted_likelihood_terms(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -A log pi: likelihood weighted by the advantage, no ratio and no clip."""
    return -adv * logprobs, torch.zeros_like(logprobs)


def _group_softmax(logits: torch.Tensor, group_N: torch.Tensor) -> torch.Tensor:
    """softmax of `logits` within each group."""
    e = torch.exp(logits - group_max(logits, group_N))
    return e / group_sum(e, group_N)
