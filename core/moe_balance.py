"""The router's load-balancing loss (trainer.router_aux_loss_coef): one definition for every strategy.

Switch Transformer's auxiliary loss (Fedus et al. 2021, eqs. 4-6) per MoE layer, as megatron-core's
`switch_load_balancing_loss_func` defines it, averaged over the layers:

    aux = 1/L * sum_l  E * sum_e f_le * P_le

f_le: the share of the micro-batch's token routes (tokens x top_k) that layer l sent to expert e
(so the f of a layer sum to 1), P_le: the mean router probability of expert e over the tokens. It is
E * sum_e f_e P_e = 1 when routing is uniform and grows as it concentrates; only P carries a gradient
(to the router). transformers' `load_balancing_loss_func` (output_router_logits) differs: it pools
the layers before the product and does not divide by top_k, so rlcore computes its own on the
routers' outputs and every strategy adds the same term. Padding tokens do not count (`mask`).
"""

from __future__ import annotations

import torch


def load_balancing_loss(probs_NE: torch.Tensor, experts_NK: torch.Tensor, mask_N: torch.Tensor) -> torch.Tensor:
    """One layer's loss over the tokens where mask_N: probs_NE the router's softmax over every
    expert, experts_NK the experts each token was routed to."""
    num_experts, top_k = probs_NE.shape[-1], experts_NK.shape[-1]
    weight_N = mask_N.to(torch.float32)
    tokens = weight_N.sum().clamp(min=1.0)
    routes_E = weight_N.new_zeros(num_experts).index_add_(
        0, experts_NK.reshape(-1).long(), weight_N.repeat_interleave(top_k)
    )
    share_E = routes_E / (tokens * top_k)
    mean_prob_E = (probs_NE.float() * weight_N[:, None]).sum(0) / tokens
    return num_experts * (share_E * mean_prob_E).sum()


def mean_over_layers(layers: list[tuple[torch.Tensor, torch.Tensor]], mask_N: torch.Tensor) -> torch.Tensor:
    """The loss of one forward: each MoE layer's (probs_NE, experts_NK), averaged."""
    if not layers:
        raise ValueError("trainer.router_aux_loss_coef: the forward went through no MoE router")
    return torch.stack([load_balancing_loss(p, e, mask_N) for p, e in layers]).mean()
