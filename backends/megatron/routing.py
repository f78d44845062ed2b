"""Routing replay on megatron-core's MoE layers (algorithm.router_replay r3).

megatron-core's top-k routing asks its router's `router_replay` object for the top-k of the scores
(moe_utils.topk_routing_with_score_function). Its own RouterReplay replays one list of records for
every router of the process at once, with no way to leave a token routing freely. `Replay` stands in
for it on each router of one model: the router's own top-k, replaced by the record where the record
covers the token, the probabilities then taken at the replayed experts (megatron-core's replay rule,
which equals transformers' for Qwen3-MoE's softmax router).

Tokens reach the router in megatron's order: sequence-major [T, B] for padded rows, the packed row
for THD, of which a context-parallel rank holds its chunks; with tensor parallelism (which
megatron-core runs with sequence parallelism for MoE layers) each TP rank's routers see its
contiguous share of that sequence dimension. Each rank replays its share of the records. A
micro-batch's records are set in the schedule's forward step and stay for its backward, so
recomputed layers route the same; that holds in megatron's schedule without pipelining, where each
micro-batch's backward follows its forward (pipeline parallelism is refused for r3 by the config
checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.transformer.moe.router import TopKRouter

from ...core import moe_balance
from ...core.moe_routing import ROUTED_EXPERTS, ROUTED_VALID, RoutingCounts, check_experts
from .packing import PackedInput


class Replay:
    """One router's replay: the experts per token of the current micro-batch, or none."""

    def __init__(self, top_k: int, num_experts: int, pre_softmax: bool = False, sequence_parallel: bool = False):
        self.top_k, self.num_experts, self.pre_softmax = top_k, num_experts, pre_softmax
        self.sequence_parallel = sequence_parallel
        """The router sees this TP rank's share of the sequence (megatron's sequence parallelism)."""
        self.target: torch.Tensor | None = None
        """[tokens, top_k] the recorded experts, in the router's token order."""
        self.valid: torch.Tensor | None = None
        """[tokens] the tokens the record covers."""
        self.counts: RoutingCounts | None = None
        self.recording: list[torch.Tensor] | None = None
        """algorithm.router_replay r2: while a list, each forward's own top-k [tokens, top_k] is added."""
        self.balance: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        """trainer.router_aux_loss_coef: while a list, each forward's (softmax over every expert, the
        experts the tokens went to) is added."""

    def get_replay_topk(
        self, scores: torch.Tensor, topk: int, num_groups: int | None, group_topk: int | None,
        default_compute_topk: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.target is None or self.valid is None:
            if self.recording is not None:
                self.recording.append(own.detach().to(torch.uint8))
            self._balanced(scores, own)
            return probs, own
        if self.target.shape[0] != own.shape[0]:
            raise ValueError(
                f"routing replay: the router saw {own.shape[0]} tokens, the record holds {self.target.shape[0]}"
            )
        experts = torch.where(self.valid[:, None], self.target, own)
        if self.counts is not None:
            other = (own.sort(-1).values != self.target.sort(-1).values).any(-1) & self.valid
            self.counts.differing += int(other.sum())
            self.counts.recorded += int(self.valid.sum())
        self._balanced(scores, experts)
        return scores.gather(1, experts), experts

    def _balanced(self, scores: torch.Tensor, experts: torch.Tensor) -> None:
        if self.balance is not None:  # scores: the logits, or the softmax already (pre_softmax)
            probs = scores.float() if self.pre_softmax else F.softmax(scores, dtype=torch.float, dim=-1)
            self.balance.append((probs, experts))


def install(module: torch.nn.Module) -> list[Replay]:
    """A Replay on each MoE router of `module`, in layer order ([] for a dense model)."""
    replays = []
    for m in module.modules():
        if isinstance(m, TopKRouter):
            m.router_replay = Replay(
                m.topk, m.config.num_moe_experts, m.config.moe_router_pre_softmax, m.config.sequence_parallel
            )
            replays.append(m.router_replay)
    return replays


def replays_of(model: torch.nn.Module) -> list[Replay]:
    """The Replays `install` put on the model's routers, in layer order."""
    found = (getattr(m, "router_replay", None) for m in model.modules())
    return [r for r in found if isinstance(r, Replay)]


def set_records(
    model: torch.nn.Module,
    mb: dict[str, torch.Tensor],
    packed: PackedInput | None,
    counts: RoutingCounts | None,
) -> None:
    """The micro-batch's records (core/batch.py: ROUTED_EXPERTS / ROUTED_VALID) on `model`'s routers,
    in megatron's token order; none when the batch carries no records."""
    replays = replays_of(model)
    experts, valid = mb.get(ROUTED_EXPERTS), mb.get(ROUTED_VALID)
    if not replays:
        return
    if experts is None or valid is None:
        clear(model)
        return
    if packed is not None:  # the packed row (sequences padded for context parallelism, a tail)
        row_experts = experts.new_zeros((packed.row_width, experts.shape[-1]))
        row_valid = valid.new_zeros(packed.row_width)
        row_experts[packed.keep] = experts[packed.layout.real]
        row_valid[packed.keep] = valid[packed.layout.real]
        mine = packed.split.index(device=experts.device)
        experts, valid = _tp_share(replays[0], row_experts[mine], row_valid[mine])
    else:  # [B, T] rows reach the router sequence-major
        experts, valid = _tp_share(replays[0], experts.transpose(0, 1), valid.transpose(0, 1))
        experts, valid = experts.flatten(0, 1), valid.flatten()
    top_k = replays[0].top_k
    if top_k * len(replays) != experts.shape[-1]:
        raise ValueError(
            f"routing replay: the experiences' records hold {experts.shape[-1]} experts per token, this model "
            f"routes {len(replays)} MoE layers x top_k {top_k}: they were recorded by another model"
        )
    check_experts(experts, replays[0].num_experts)
    per_layer = experts.view(-1, len(replays), top_k).long()
    for layer, replay in enumerate(replays):
        replay.target, replay.valid, replay.counts = per_layer[:, layer], valid, counts


def _tp_share(replay: Replay, *sequence_major: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """This TP rank's contiguous share of each tensor's first (sequence) dimension, as sequence
    parallelism scatters the layer input; the tensors whole without it."""
    if not replay.sequence_parallel:
        return sequence_major
    size, rank = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()
    return tuple(t.chunk(size, dim=0)[rank] for t in sequence_major)


def record(model: torch.nn.Module) -> None:
    """algorithm.router_replay r2: the routers' own choices of the next forward are kept (`recorded`)."""
    for replay in replays_of(model):
        replay.recording = []


def recorded(model: torch.nn.Module) -> torch.Tensor:
    """[tokens, layers, top_k] uint8: what the routers chose in the forward since `record`, in
    megatron's token order (this rank's)."""
    replays = replays_of(model)
    taken = [replay.recording.pop() for replay in replays if replay.recording]
    if len(taken) != len(replays):
        raise RuntimeError("routing replay: a router recorded nothing in the forward")
    for replay in replays:
        replay.recording = None
    return torch.stack(taken, dim=1)


def set_own(model: torch.nn.Module, own: torch.Tensor, counts: RoutingCounts | None) -> None:
    """algorithm.router_replay r2: replay `recorded`'s record of the same micro-batch on every token."""
    valid = torch.ones(own.shape[0], dtype=torch.bool, device=own.device)
    for layer, replay in enumerate(replays_of(model)):
        replay.target, replay.valid, replay.counts = own[:, layer].long(), valid, counts


def balance(model: torch.nn.Module) -> None:
    """trainer.router_aux_loss_coef: the routers' outputs of the next forward are kept (`balance_loss`)."""
    for replay in replays_of(model):
        replay.balance = []


def balance_loss(model: torch.nn.Module, mask_N: torch.Tensor) -> torch.Tensor:
    """The load-balancing loss (core/moe_balance.py) of the forward since `balance`, over the tokens
    where mask_N (megatron's token order); the capture stops."""
    layers = []
    for replay in replays_of(model):
        if replay.balance:
            layers.append(replay.balance[0])
        replay.balance = None
    return moe_balance.mean_over_layers(layers, mask_N)


def clear(model: Any) -> None:
    for replay in replays_of(model):
        replay.target = replay.valid = replay.counts = None
        replay.recording = replay.balance = None
