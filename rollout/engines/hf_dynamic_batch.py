"""A running batch's rows in transformers' dynamic cache (hf_running.BatchRows): the eager loop's
continuous batching (CPU, enforce_eager, and calls with an adapter on a GPU).

A joining request's cache is laid beside the running one, both left-padded to the longer; rows that
end are cut out with their cache, and the columns no remaining row attends to are cut from the
left. Only full-attention layers can be laid side by side and trimmed (`full_attention`): an engine
offers no running batch for a model with sliding-window or chunked layers.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...core import moe_routing


class DynamicRows:
    """Rows in transformers' dynamic cache: a joining request's cache is laid beside the running
    one (both left-padded to the longer), rows that leave are cut out with their cache, and the
    columns no remaining row attends to are cut from the left. `routing` is entered around each
    forward, its record taken."""

    def __init__(self, model: Any, routing: moe_routing.RoutingRecorder | None = None):
        self.model, self.routing = model, routing
        self.cache: DynamicCache | None = None
        self.mask_AL = self.positions_A = self.logits_AV = torch.empty(0)

    def join(
        self, cache: DynamicCache, mask_AL: torch.Tensor, positions_A: torch.Tensor, logits_AV: torch.Tensor,
        budgets: list[int],
    ) -> None:  # fmt: skip
        if self.cache is None:
            self.cache, self.mask_AL, self.positions_A, self.logits_AV = cache, mask_AL, positions_A, logits_AV
            return
        width = max(self.mask_AL.shape[1], mask_AL.shape[1])
        layers = _dynamic_layers(self.cache), _dynamic_layers(cache)
        for running, joining in zip(*layers, strict=True):
            for name in ("keys", "values"):
                old, new = getattr(running, name), getattr(joining, name)
                setattr(running, name, torch.cat([_left_pad(old, width, -2), _left_pad(new, width, -2)]))
        self.mask_AL = torch.cat([_left_pad(self.mask_AL, width, -1), _left_pad(mask_AL, width, -1)])
        self.positions_A = torch.cat([self.positions_A, positions_A])
        self.logits_AV = torch.cat([self.logits_AV, logits_AV])

    def keep(self, keep_A: torch.Tensor) -> None:
        """Only the rows `keep_A` decode on; cache columns none of them attends to are dropped."""
        if not bool(keep_A.any()):
            self.cache = None
            return
        assert self.cache is not None
        self.cache.batch_select_indices(keep_A.nonzero().squeeze(-1))
        self.mask_AL, self.positions_A = self.mask_AL[keep_A], self.positions_A[keep_A]
        if not full_attention(self.cache):  # a sliding window's layers keep their own length
            return
        first = int(self.mask_AL.any(dim=0).int().argmax())  # the first column a row attends to
        if first > 0:
            self.mask_AL = self.mask_AL[:, first:]
            for layer in _dynamic_layers(self.cache):
                assert layer.keys is not None and layer.values is not None
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def feed(self, token_A: torch.Tensor) -> torch.Tensor | None:
        """Each row's token at its next position (the cache grows by one column)."""
        assert self.cache is not None
        self.mask_AL = torch.cat([self.mask_AL, self.mask_AL.new_ones((self.mask_AL.shape[0], 1))], dim=1)
        self.positions_A = self.positions_A + 1
        with self.routing if self.routing is not None else nullcontext():
            self.logits_AV = self.model(
                input_ids=token_A[:, None], attention_mask=self.mask_AL, position_ids=self.positions_A[:, None],
                past_key_values=self.cache, use_cache=True,
            ).logits[:, -1]  # fmt: skip
        return None if self.routing is None else self.routing.take()


def full_attention(cache: DynamicCache) -> bool:
    """Whether every layer of `cache` holds all positions (no sliding window or chunk): only such
    caches are laid side by side and trimmed."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = [layer for layer in cache.layers if type(layer) is DynamicLayer]
    if len(layers) != len(cache.layers):
        raise ValueError("the running batch lays caches side by side only for full-attention layers")
    return layers


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`x` padded with zeros at the start of `dim` to `width` entries."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (-dim - 1) + [missing, 0]
    return F.pad(x, pad)
