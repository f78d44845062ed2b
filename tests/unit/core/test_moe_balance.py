"""The routers' load-balancing loss (core/moe_balance.py): Switch Transformer's per layer, as
megatron-core defines it (transformers' for one layer, divided by top_k), averaged over layers,
padding left out."""

from __future__ import annotations

import pytest
import torch

from rlcore.core.moe_balance import load_balancing_loss, mean_over_layers


def test_one_layer_is_transformers_loss_over_top_k_and_padding_does_not_count() -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(13, 4, generator=gen)
    probs, experts = logits.softmax(-1), logits.topk(2, -1).indices
    ours = load_balancing_loss(probs, experts, torch.ones(13, dtype=torch.bool))
    assert ours.item() == pytest.approx(load_balancing_loss_func((logits,), 4, 2, None).item() / 2, rel=1e-6)
    mask = torch.arange(13) < 9  # 4 padding tokens, whatever they routed to
    padded = load_balancing_loss(probs, experts, mask)
    assert padded.item() == pytest.approx(load_balancing_loss(probs[:9], experts[:9], mask[:9]).item(), rel=1e-6)
    uniform = load_balancing_loss(torch.full((4, 4), 0.25), torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]]), mask[:4])
    assert uniform.item() == pytest.approx(1.0)  # perfectly balanced: 1


def test_layers_are_averaged_and_only_the_probabilities_carry_a_gradient() -> None:
    gen = torch.Generator().manual_seed(1)
    layers = []
    for _ in range(3):
        logits = torch.randn(6, 4, generator=gen, requires_grad=True)
        layers.append((logits.softmax(-1), logits.topk(2, -1).indices))
    mask = torch.ones(6, dtype=torch.bool)
    loss = mean_over_layers(layers, mask)
    assert loss.item() == pytest.approx(sum(load_balancing_loss(p, e, mask).item() for p, e in layers) / 3)
    loss.backward()
    with pytest.raises(ValueError, match="trainer.router_aux_loss_coef: the forward went through no MoE router"):
        mean_over_layers([], mask)
