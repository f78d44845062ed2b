"""The TrainingStrategy interface: what the training loop needs from a backend.

Batches are dicts of tensors laid out by `rlcore.core.batch` (right-padded [B, T]; position t of
every per-token field refers to predicting input_ids[:, t] from the tokens before it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.distributed as dist

from ..core.strategy_capabilities import Capabilities

Batch = dict[str, torch.Tensor]


@dataclass
class AdamHparams:
    """One step's AdamW hyperparameters (a Tinker client's AdamParams)."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip: float
    """Max global gradient norm; 0 clips nothing."""


class LossFn(Protocol):
    """Maps the policy's per-token log-probs/entropy on one micro-batch to a loss (a critic's
    per-token values, entropy None, with `value_head`).

    The returned loss and metrics are this micro-batch's contribution to the whole train batch
    (normalised by global token/sequence counts), so summing over micro-batches and ranks gives
    the global value.
    """

    needs_entropy: bool

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


class TrainingStrategy(ABC):
    """One training backend across all ranks of the trainer world.

    Construction: `Strategy(model_path, trainer_cfg, optimizer_cfg, *, device, dtype, total_steps,
    with_reference, seed, value_head=False, head_bias=True, lora=None)`; every rank builds it,
    collectives happen inside. `value_head=True` builds a critic (the model's trunk with a scalar
    head, backends/common/hf_model.load_value_model): loss functions then get per-token values in
    place of log-probs, and `compute_values` replaces `compute_logprobs`; `head_bias=False` leaves
    the head without a bias (a reward model's). `lora` (a LoraConfig) trains a LoRA adapter on
    a frozen base instead of the full weights (`adapter_config`).

    Data parallelism: the loop gives each data-parallel rank its own share of a batch; ranks that
    split one model replica (tensor or pipeline parallel) get the same share. Strategies without
    model parallelism keep the defaults (every rank is its own data-parallel rank).
    """

    capabilities: ClassVar[Capabilities]
    """What the strategy can do: its row of core/strategy_capabilities.py's table, which the config
    checks read without importing it."""

    packs_sequences: bool = False
    """Whether the model runs on each micro-batch's real tokens only (trainer.use_remove_padding on a
    strategy that can: backends/common/packed.py); the loop then budgets micro-batches by their
    summed lengths instead of rows x the longest."""

    sequence_split: int = 1
    """How many ranks each packed micro-batch is split over (Ulysses, context parallelism): each holds
    1/sequence_split of its tokens, so a micro-batch may hold that many times a rank's budget."""

    reference_in_checkpoint: bool = False
    """Whether checkpoints hold the reference model too (the loop sets it when the reference moves:
    algorithm.sync_ref_model); otherwise the reference is the stage's initial weights."""

    def policy_and_reference(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The policy and reference modules, built and sharded alike (parameters in the same order,
        each rank holding the same part of both)."""
        raise NotImplementedError(f"{type(self).__name__} has no reference model to move")

    @torch.no_grad()
    def sync_reference(self, alpha: float) -> None:
        """pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref (TR-DPO's soft update, Gorbatovski et
        al. 2024, arXiv:2404.09656): each rank blends its own part; no communication."""
        policy, reference = self.policy_and_reference()
        for p, r in zip(policy.parameters(), reference.parameters(), strict=True):
            r.lerp_(p.detach().to(r.dtype), alpha)

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (which share of the batch it trains on)."""
        return dist.get_rank()

    @property
    def dp_size(self) -> int:
        return dist.get_world_size()

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The group of data-parallel peers (one rank per share of the batch); None: the world."""
        return None

    @abstractmethod
    def forward_backward(
        self, micro_batches: list[Batch], loss_fn: LossFn, temperature: float
    ) -> dict[str, float]:
        """Accumulate gradients of `loss_fn` over this rank's micro-batches; return metrics summed over
        micro-batches and ranks (identical on every rank)."""

    @abstractmethod
    def optimizer_step(self) -> float:
        """Clip, step the optimizer and the lr schedule, zero grads; return the pre-clip grad norm."""

    @abstractmethod
    def compute_logprobs(
        self, micro_batches: list[Batch], temperature: float, reference: bool = False
    ) -> list[torch.Tensor]:
        """Per-token log-probs [B, T] of each micro-batch under the policy (or the frozen reference)."""

    replays_routing: bool = False
    """Routing replay (algorithm.router_replay r3): forwards force the experts a micro-batch's routing
    records name (core/batch.py). Set on the policy only: a critic, a teacher or any other model
    built from the same class routes by itself, records or not."""
    router_aux_loss_coef: float = 0.0
    """trainer.router_aux_loss_coef: forward_backward adds this weight times the routers'
    load-balancing loss (core/moe_balance.py) to each micro-batch's loss, its share of the batch's
    mean, and reports it (actor/router_aux_loss). Set on the policy only."""
    records_routing: bool = False
    """Routing replay of the trainer's own routing (algorithm.router_replay r2): compute_logprobs of
    the policy records each micro-batch's routing into it (core/moe_routing.OWN_ROUTES) and
    forward_backward replays it, counting the routes the updated router would have chosen otherwise
    (take_routing_counts). Set on the policy only, as replays_routing."""

    def take_routing_counts(self) -> tuple[int, int]:
        """Routing replay: of the token routes the policy's compute_logprobs replayed since the last
        call (this rank's), how many the router would have chosen otherwise, and how many there were;
        (0, 0) for a strategy that replays none."""
        return 0, 0

    def compute_values(self, micro_batches: list[Batch]) -> list[torch.Tensor]:
        """A critic's per-token values [B, T] of each micro-batch (position t: the value of the state
        before input_ids[t]; position 0 is 0)."""
        raise NotImplementedError(f"{type(self).__name__} builds no critic")

    @abstractmethod
    def current_lr(self) -> float: ...

    can_reset_optimizer = False
    """Whether reset_optimizer works here."""

    def reset_optimizer(self) -> None:
        """Drop the optimizer's state (moments, step counts): the next step starts it afresh."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart its optimizer")

    def set_step_hparams(self, adam: AdamHparams | None) -> None:
        """The next optimizer_step's AdamW hyperparameters in place of the configured optimizer's
        and lr schedule's (None: the configured ones again)."""
        raise NotImplementedError(f"{type(self).__name__} takes no per-step optimizer hyperparameters")

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer and scheduler state under `path` (collective)."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what `save_checkpoint` wrote (collective)."""

    @abstractmethod
    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (hf_name, full tensor) in the same order on every rank, one tensor at a time
        (collective: every rank must consume the iterator to the end)."""

    @abstractmethod
    def iter_full_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        """After `forward_backward` and before `optimizer_step`: (hf_name, full gradient of the summed
        loss) in `iter_full_weights` order (collective, like it); with LoRA the adapter's, in
        `iter_adapter_weights` order. For checking that strategies agree."""

    @abstractmethod
    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(hf_name, dtype, full shape) of what `iter_full_weights` yields, in the same order,
        without moving any data (weight sync announces them before sending bytes)."""

    @abstractmethod
    def hf_config(self) -> Any:
        """The model's transformers config (for HF export)."""

    def adapter_config(self) -> dict[str, Any] | None:
        """With a LoRA adapter (model.lora_configs): its peft config (adapter_config.json's content);
        None when the full weights train. `iter_full_weights` then yields the merged weights and
        `iter_full_grads` the adapter's gradients."""
        return None

    def iter_adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name as peft saves it, full tensor) of the LoRA adapter (collective, like
        `iter_full_weights`)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")
