"""Routing replay on the trainer's transformers forwards (algorithm.router_replay r3): a micro-batch's
routing records (core/batch.py: the engine's experts per token) laid out in the order the model
flattens its tokens, padded rows or the packed row (over a sequence-parallel group, this rank's
slice of it), and handed to core/moe_routing.replayed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from ...core import moe_balance, moe_routing
from ...core.moe_routing import ROUTED_EXPERTS, ROUTED_VALID
from .packed import Packed
from .ulysses import SequenceParallel


def packed_width(layout: Packed, sp: SequenceParallel | None) -> int:
    """The packed row's length as the model runs it: its tokens, rounded up to a multiple of the
    sequence-parallel group's size (the padding tail is a sequence of its own)."""
    size = 1 if sp is None else sp.size
    return -(-layout.num_tokens // size) * size


def replay_routing(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    packed: bool,
    sp: SequenceParallel | None,
    counts: moe_routing.RoutingCounts | None = None,
) -> AbstractContextManager:
    """The context the micro-batch's forward and backward run in: its rows' recorded experts
    replayed (positions without a record route freely; `counts`: moe_routing.replayed's); nothing
    when the batch carries no records."""
    experts, valid = batch.get(ROUTED_EXPERTS), batch.get(ROUTED_VALID)
    if experts is None or valid is None:
        return nullcontext()
    if packed or sp is not None:
        layout = Packed.of(batch)
        width = packed_width(layout, sp)
        experts, valid = experts[layout.real], valid[layout.real]
        tail = width - layout.num_tokens
        if tail:
            experts = torch.cat([experts, experts.new_zeros((tail, experts.shape[1]))])
            valid = torch.cat([valid, valid.new_zeros(tail)])
        if sp is not None:
            part = sp.slice_of(width)
            experts, valid = experts[part], valid[part]
    else:
        experts, valid = experts.flatten(0, 1), valid.flatten()
    layers, top_k = moe_routing.shape_of(model)
    if experts.shape[-1] != layers * top_k:
        raise ValueError(
            f"routing replay: the experiences' records hold {experts.shape[-1]} experts per token, this "
            f"model routes {layers} MoE layers x top_k {top_k}: they were recorded by another model"
        )
    return moe_routing.replayed(model, experts.view(-1, layers, top_k).long(), valid, counts)


class BalanceCapture:
    """What each MoE router of one forward saw and chose ((softmax over every expert, experts) per
    layer, in layer order), for the load-balancing loss (core/moe_balance.py)."""

    def __init__(self, mask_N: torch.Tensor | None) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.mask_N = mask_N
        """The tokens that count, in the model's order (None: every token of the forward)."""

    def hook(self, router: torch.nn.Module, args: Any, output: tuple[torch.Tensor, ...]) -> None:
        logits, _, experts = output  # after a replay's hook: the experts the tokens went to
        self.layers.append((F.softmax(logits, dtype=torch.float, dim=-1), experts))

    def loss(self, num_layers: int) -> torch.Tensor:
        """The first forward's loss (a recompute in the backward adds more layers, unused)."""
        layers = self.layers[:num_layers]
        if not layers:
            return moe_balance.mean_over_layers(layers, torch.ones(0, dtype=torch.bool))  # raises, naming the key
        mask = self.mask_N if self.mask_N is not None else torch.ones(layers[0][0].shape[0], dtype=torch.bool)
        return moe_balance.mean_over_layers(layers, mask.to(layers[0][0].device))


@contextmanager
def load_balance(model: torch.nn.Module, batch: dict[str, torch.Tensor], packed: bool) -> Iterator[BalanceCapture]:
    """The routers' outputs of the forward inside, captured (hooks registered after any replay's);
    padding tokens of padded rows do not count, a packed row holds none."""
    found = moe_routing.routers(model)
    if not found:
        raise ValueError(
            f"trainer.router_aux_loss_coef: this {type(model).__name__} has no MoE router (a dense model, or "
            f"one whose router is not {', '.join(moe_routing.ROUTERS)}); set it to 0"
        )
    capture = BalanceCapture(None if packed else batch["attention_mask"].flatten().bool())
    handles = [r.register_forward_hook(capture.hook) for r in found]
    try:
        yield capture
    finally:
        for h in handles:
            h.remove()
