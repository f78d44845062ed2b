"""Which experts a transformers MoE model's routers chose: recorded, and replayed (routing replay).

An MoE model's engine and trainer route a token to different experts often enough (another batch
shape, dtype or kernel tips a near tie of the router's top-k) that the trainer's log-probs of a
response are not the ones it was sampled under: the main source of the engine/trainer gap that
collapses MoE RL runs. Rollout routing replay (R3, arXiv 2510.11370) records the experts the engine
chose for every token and makes the trainer's forward use them: the router's weights still get
their gradient, through the softmax probabilities of the replayed experts.

Layout (the wire's and the buffer's): the experts chosen for each token the model ran on, in order
(the prompt's tokens, then each response token but the last, which no forward reads), as uint8
bytes of shape [tokens, layers, top_k], the MoE layers in model order. `routing_tokens` says how many
tokens a sequence's record covers.

Proven for transformers' Qwen3-MoE router only (ROUTERS): its forward(hidden) returns (logits,
scores, indices), scores being the softmax probabilities of the top-k experts, renormalised over
them when `norm_topk_prob`. Any other router class is refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .types import routing_tokens

__all__ = [
    "RoutingCounts", "RoutingRecorder", "check_experts", "from_bytes", "replayed", "routers", "routing_tokens",
    "shape_of", "to_bytes",
]  # fmt: skip

ROUTED_EXPERTS = "routed_experts"
"""A micro-batch's routing records (core/batch.py): uint8 [B, T, layers * top_k], position t the
experts token t was routed to."""
ROUTED_VALID = "routed_valid"
"""[B, T] bool: the positions a record covers (the others route freely)."""
OWN_ROUTES = "own_routes"
"""algorithm.router_replay r2: the experts the policy's own old-log-prob pass routed a micro-batch's
tokens to, uint8 [tokens, layers, top_k] in the order that strategy's model takes them (this rank's
share): its update forwards replay them."""
ROUTERS = ("Qwen3MoeTopKRouter",)
"""transformers router classes whose contract (above) routing replay is proven on."""
MAX_EXPERTS = 256
"""Expert indices travel as uint8."""


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order; [] for a dense model. A router of a class routing
    replay is not proven on is refused (ValueError, naming it)."""
    found = [m for m in model.modules() if type(m).__name__.endswith("Router")]
    unknown = sorted({type(m).__name__ for m in found} - set(ROUTERS))
    if unknown:
        raise ValueError(
            f"routing replay is proven for {', '.join(ROUTERS)} (Qwen3-MoE) only; this model's routers "
            f"are {', '.join(unknown)}: set algorithm.router_replay: none"
        )
    experts = int(found[0].num_experts) if found else 0  # type: ignore[arg-type]
    if experts > MAX_EXPERTS:
        raise ValueError(
            f"routing replay records expert indices as uint8: at most {MAX_EXPERTS} experts, this model "
            f"has {experts}; set algorithm.router_replay: none"
        )
    return found


def shape_of(model: torch.nn.Module) -> tuple[int, int]:
    """(MoE layers, top_k) of the model's routing records."""
    found = routers(model)
    return len(found), (int(found[0].top_k) if found else 0)  # type: ignore[arg-type]


def to_bytes(experts_NLK: torch.Tensor) -> bytes:
    """A record [tokens, layers, top_k] as the wire's bytes."""
    return experts_NLK.to(torch.uint8).cpu().contiguous().numpy().tobytes()


def from_bytes(data: bytes, layers: int, top_k: int) -> torch.Tensor:
    """The wire's bytes as a record [tokens, layers, top_k] (uint8)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(-1, layers, top_k)


def check_experts(experts: torch.Tensor, num_experts: int) -> None:
    """ValueError in one line for a record naming an expert the model does not have (a record of
    another model; out of range, it would index past the router's probabilities)."""
    if experts.numel() and int(experts.max()) >= num_experts:
        raise ValueError(
            f"routing replay: a record names expert {int(experts.max())}, this model has {num_experts}: "
            "it was recorded by another model"
        )


class RoutingRecorder:
    """Records the experts each router chose in every forward while active (`with recorder:`):
    `calls[i]` is the i-th forward's record [tokens of that forward, layers, top_k] (uint8), the
    tokens in the order the model flattened them (batch-major)."""

    def __init__(self, model: torch.nn.Module):
        self._routers = routers(model)
        if not self._routers:
            raise ValueError(
                f"routing replay: this {type(model).__name__} has no MoE router to record (a dense model, "
                f"or one whose router is not {', '.join(ROUTERS)}); set algorithm.router_replay: none"
            )
        self._pending: list[torch.Tensor] = []
        self.calls: list[torch.Tensor] = []
        self._handles: list[Any] = []

    def __enter__(self) -> RoutingRecorder:
        if self._handles:  # its hooks would fire twice a router: every record torn in two
            raise RuntimeError("this RoutingRecorder is active already; enter it once (`with` it, or hand it to one user)")
        self._handles = [r.register_forward_hook(self._hook) for r in self._routers]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, module: torch.nn.Module, args: Any, output: tuple[torch.Tensor, ...]) -> None:
        self._pending.append(output[2].detach().to(torch.uint8))  # 1 byte an expert, as on the wire
        if len(self._pending) == len(self._routers):  # the forward's last MoE layer
            self.calls.append(torch.stack(self._pending, dim=1))
            self._pending = []

    def take(self) -> torch.Tensor:
        """The oldest forward's record, removed."""
        return self.calls.pop(0)


@dataclass
class RoutingCounts:
    """Token routes (a token in one MoE layer) the replay forced, and how many of them the router
    would have chosen otherwise (another set of experts): the engine/trainer routing mismatch."""

    differing: int = 0
    recorded: int = 0

    def take(self) -> tuple[int, int]:
        """(differing, recorded) so far, and start again from zero."""
        out = (self.differing, self.recorded)
        self.differing = self.recorded = 0
        return out


@contextmanager
def replayed(
    model: torch.nn.Module,
    experts_NLK: torch.Tensor,
    valid_N: torch.Tensor,
    counts: RoutingCounts | None = None,
) -> Iterator[None]:
    """Every forward of `model` inside routes token n to experts_NLK[n] (in each MoE layer) where
    valid_N[n], and by its own top-k elsewhere; tokens in the order the model flattens its input
    (batch-major). Keep backward inside too: a recomputed layer (gradient checkpointing) routes again.
    The replayed experts' weights are the router's softmax probabilities at them (renormalised over
    them when the router's `norm_topk_prob`), so the router trains as it would have chosen them.
    `counts` adds up how often the router's own choice differed from the record's (each forward)."""
    found = routers(model)
    if experts_NLK.shape[1:] != (len(found), found[0].top_k if found else 0):
        raise ValueError(
            f"a routing record of shape [tokens, layers, top_k] = {list(experts_NLK.shape)} does not fit "
            f"this model ({len(found)} MoE layers, top_k {found[0].top_k if found else 0})"
        )
    check_experts(experts_NLK, int(found[0].num_experts) if found else 0)  # type: ignore[arg-type]
    experts_NLK = experts_NLK.long()
    handles = [
        router.register_forward_hook(_replay_hook(experts_NLK[:, layer], valid_N, counts))
        for layer, router in enumerate(found)
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _replay_hook(target_NK: torch.Tensor, valid_N: torch.Tensor, counts: RoutingCounts | None) -> Any:
    def hook(
        router: torch.nn.Module, args: Any, output: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
        logits, _, own = output
        if logits.shape[0] != target_NK.shape[0]:
            raise ValueError(
                f"routing replay: the model routed {logits.shape[0]} tokens, the record holds "
                f"{target_NK.shape[0]}"
            )
        target, valid = target_NK.to(own.device), valid_N.to(own.device)
        experts = torch.where(valid[:, None], target, own)
        if counts is not None:
            other = (own.sort(-1).values != target.sort(-1).values).any(-1) & valid
            counts.differing += int(other.sum())
            counts.recorded += int(valid.sum())
        probs = F.softmax(logits, dtype=torch.float, dim=-1).gather(1, experts)
        if router.norm_topk_prob:
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return logits, probs.to(logits.dtype), experts

    return hook
