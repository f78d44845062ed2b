"""What the PyTorch-native strategies (FSDP1, FSDP2) share once their model is wrapped.

Both hold an HF module (`model`: a causal LM, or with `value_head` a critic; and a frozen
`reference` for KL), a torch AdamW with a LambdaLR
schedule, in float16 a dynamic loss scale, and DCP checkpoints; they differ only in how gradients
synchronise across micro-batches, how the global gradient norm is taken, and how full tensors are
gathered.

With LoRA (model.lora_configs) the policy is a peft model (lora.py): the optimizer steps the adapter
only, the reference is the same model with the adapter switched off (no second model), checkpoints
hold the adapter and its optimizer, and the full weights come out merged.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from ...core import moe_routing
from ...core.config.schema import LoraConfig
from ...core.moe_routing import OWN_ROUTES, RoutingCounts, RoutingRecorder, replayed
from ..base import AdamHparams, Batch, LossFn, TrainingStrategy
from .attention import use_packed_attention
from .dist_utils import all_reduce_sum
from .hf_model import forward_logprobs, forward_values, freeze_routers, load_causal_lm, load_value_model
from .lora import LoraLayout, adapter_off, apply_lora
from .routing import load_balance, replay_routing
from .schedule import FP16_INITIAL_LOSS_SCALE
from .sharded_checkpoint import REFERENCE_DIR, load_module, load_sharded, save_module, save_sharded
from .ulysses import SequenceParallel


def float16_scaler(compute_dtype: torch.dtype, device: torch.device) -> ShardedGradScaler | None:
    """A dynamic loss scale for float16 compute, whose backward flushes small gradients to zero
    (bfloat16 has float32's range and needs none). An overflow on any rank skips the step on every
    rank and halves the scale."""
    if compute_dtype != torch.float16:
        return None
    return ShardedGradScaler(device=device.type, init_scale=FP16_INITIAL_LOSS_SCALE)


class NativeStrategy(TrainingStrategy):
    model: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    device: torch.device
    world_size: int
    grad_clip: float
    scaler: ShardedGradScaler | None = None
    """float16 only (float16_scaler): gradients stay multiplied by its scale until optimizer_step."""
    value_head: bool = False
    """A critic: the loss functions get per-token values where a policy's get log-probs."""
    head_bias: bool = True
    """The value head has a bias (a critic's; a reward model's has none)."""
    lora: LoraLayout | None = None
    """With a LoRA adapter: its layout (the policy is then a peft model)."""
    _peft: Any = None
    """The peft model itself (FSDP1 wraps it), for switching the adapter off."""
    _step_hparams: AdamHparams | None = None
    """The next steps' AdamW hyperparameters in place of the configured ones (set_step_hparams)."""
    _configured: list[tuple[Any, float, float]] | None = None
    """The configured betas, eps and weight decay per group, once a step overrode them."""
    sp: SequenceParallel | None = None
    """With trainer.ulysses_sequence_parallel_size > 1: this rank's sequence-parallel group (its
    ranks share one data-parallel share, each forward sliced over them: ulysses.py)."""
    _dp: dist.ProcessGroup | None = None
    """With `sp`: the ranks at this rank's place in every sequence-parallel group."""
    _routes: RoutingCounts | None = None
    """Routing replay: what the policy's compute_logprobs replayed since take_routing_counts."""

    def _sequence_parallel(self, size: int) -> None:
        """Build the sequence-parallel groups (collective; nothing with size 1)."""
        if size > 1:
            self.sp, self._dp = SequenceParallel.build(size)
            self.sequence_split = size

    @property
    def dp_rank(self) -> int:
        return dist.get_rank() if self.sp is None else dist.get_rank() // self.sp.size

    @property
    def dp_size(self) -> int:
        return self.world_size if self.sp is None else self.world_size // self.sp.size

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return self._dp

    def _prepared(self, model: torch.nn.Module) -> torch.nn.Module:
        """A loaded HF model switched to packed attention (attention.py) when the strategy packs
        sequences or slices them over a sequence-parallel group."""
        if self.packs_sequences or self.sp is not None:
            use_packed_attention(model, 1 if self.sp is None else self.sp.size)
        return model

    def _load(
        self, model_path: str, seed: int, gradient_checkpointing: bool, lora: LoraConfig | None = None,
        freeze_router: bool = False,
    ) -> torch.nn.Module:  # fmt: skip
        if self.value_head:
            model = load_value_model(model_path, seed, gradient_checkpointing, self.head_bias)
        else:
            model = load_causal_lm(model_path, gradient_checkpointing)
        self._prepared(model)
        if freeze_router:
            freeze_routers(model)
        if self.value_head:
            return model
        if lora is not None:
            model = self._peft = apply_lora(model, lora, seed)
            self.lora = LoraLayout.of(model, lora.name)
        return model

    def _outputs(
        self, model: torch.nn.Module, mb: Batch, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.value_head:
            return forward_values(model, mb, self.packs_sequences, self.sp), None
        return forward_logprobs(model, mb, temperature, with_entropy, self.packs_sequences, self.sp)

    @abstractmethod
    def _gradient_sync(self, last: bool) -> AbstractContextManager:
        """Context for one micro-batch's backward: reduce gradients across ranks only when `last`."""

    @abstractmethod
    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip to `max_norm`; return the global pre-clip norm as a plain tensor."""

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def forward_backward(
        self, micro_batches: list[Batch], loss_fn: LossFn, temperature: float
    ) -> dict[str, float]:
        self.model.train()
        totals: dict[str, float] = defaultdict(float)
        drift = self._routes if self.records_routing else None
        for i, mb in enumerate(micro_batches):
            mb = self._to_device(mb)
            # around the backward too: a recomputed layer routes again
            with (
                self._gradient_sync(i == len(micro_batches) - 1),
                self._replay(self.model, mb, drift),
                self._balance(mb) as balance,
            ):
                logprobs, entropy = self._outputs(self.model, mb, temperature, loss_fn.needs_entropy)
                loss, metrics = loss_fn(logprobs, entropy, mb)
                if balance is not None:  # this micro-batch's share of the batch's mean
                    aux = balance.loss(self._moe_layers) / (len(micro_batches) * self.dp_size)
                    loss = loss + self.router_aux_loss_coef * aux
                    metrics = {**metrics, "actor/router_aux_loss": float(aux)}
                # FSDP averages gradients over ranks while the loss is already this rank's share of
                # the global mean: scaling by the world size turns the average back into the sum
                # (with sequence parallelism every rank of a group computes its share's loss and the
                # all-gather's backward sums their gradients: by the data-parallel size, then)
                loss = loss * self.dp_size
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            for k, v in metrics.items():
                totals[k] += v
        return all_reduce_sum(dict(totals), self.device, self.dp_group)

    def optimizer_step(self) -> float:
        """Clip, then step unless the norm is inf/nan (a bad batch must not poison the weights); zero
        the gradients and advance the lr schedule either way. float16 first divides the loss scale
        out and afterwards updates it (halved after an overflow)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        adam, grad_clip = self._step_hparams, self.grad_clip
        groups = self.optimizer.param_groups
        if adam is not None:
            grad_clip = adam.grad_clip
            if self._configured is None:  # what a step without hyperparameters of its own goes back to
                self._configured = [(g["betas"], g["eps"], g["weight_decay"]) for g in groups]
            for group in groups:
                group.update(lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay)
        elif self._configured is not None:  # the schedule sets lr; LambdaLR leaves the rest
            for group, (betas, eps, weight_decay) in zip(groups, self._configured, strict=True):
                group.update(betas=betas, eps=eps, weight_decay=weight_decay)
        norm = self._clip_grad_norm(grad_clip if grad_clip > 0 else float("inf"))
        if torch.isfinite(norm):  # a float16 overflow shows here too: the norm is global
            self.optimizer.step()  # (not scaler.step: on CPU it breaks the fused AdamW)
        if self.scaler is not None:
            self.scaler.update()  # the overflow unscale_ found on any rank halves the scale
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(norm)

    @torch.no_grad()
    def compute_logprobs(
        self, micro_batches: list[Batch], temperature: float, reference: bool = False
    ) -> list[torch.Tensor]:
        model: torch.nn.Module | None = self.model
        view: AbstractContextManager = nullcontext()
        if reference and self.lora is not None:
            view = adapter_off(self._peft)  # the reference: the base model under the adapter
        elif reference:
            model = self.reference
        assert model is not None, "compute_logprobs(reference=True) without a reference model"
        model.eval()  # no dropout (LoRA's): log-probs of the policy the engines run
        out = []
        with view:
            if self._routes is None:
                self._routes = RoutingCounts()
            counts = None if reference else self._routes
            records = self.records_routing and not reference
            for batch in micro_batches:
                mb = self._to_device(batch)
                with self._replay(model, mb, counts), self._recording(model, batch, records):
                    logprobs, _ = forward_logprobs(
                        model, mb, temperature, False, self.packs_sequences, self.sp
                    )
                out.append(logprobs.float().cpu())
        return out

    @contextmanager
    def _recording(self, model: torch.nn.Module, batch: Batch, records: bool) -> Iterator[None]:
        """algorithm.router_replay r2: the routing of the forward inside, recorded into `batch`
        (OWN_ROUTES: the model's token order) for forward_backward to replay."""
        if not records:
            yield
            return
        with RoutingRecorder(model) as recorder:
            yield
        batch[OWN_ROUTES] = recorder.take().cpu()

    def _balance(self, mb: Batch) -> AbstractContextManager:
        """trainer.router_aux_loss_coef > 0: the routers' outputs of the micro-batch's forward."""
        if not self.router_aux_loss_coef:
            return nullcontext()
        if self.sp is not None:
            raise ValueError(
                "trainer.router_aux_loss_coef with trainer.ulysses_sequence_parallel_size > 1: each rank's "
                "routers see a slice of the tokens, which the loss does not combine yet; set one of them off"
            )
        return load_balance(self.model, mb, self.packs_sequences)

    @property
    def _moe_layers(self) -> int:
        return len(moe_routing.routers(self.model))

    def _replay(
        self, model: torch.nn.Module, mb: Batch, counts: RoutingCounts | None = None
    ) -> AbstractContextManager:
        """The micro-batch's routing records replayed on `model` (routing.py), when this is the policy
        that replays them: the engine's (r3), or those of its own old-log-prob pass (r2)."""
        if self.records_routing and OWN_ROUTES in mb:
            own = mb[OWN_ROUTES]
            return replayed(model, own, torch.ones(own.shape[0], dtype=torch.bool), counts)
        if not self.replays_routing:
            return nullcontext()
        return replay_routing(model, mb, self.packs_sequences, self.sp, counts)

    def take_routing_counts(self) -> tuple[int, int]:
        return (0, 0) if self._routes is None else self._routes.take()

    @torch.no_grad()
    def compute_values(self, micro_batches: list[Batch]) -> list[torch.Tensor]:
        assert self.value_head, "compute_values on a policy (build the strategy with value_head=True)"
        return [
            forward_values(self.model, self._to_device(mb), self.packs_sequences, self.sp).cpu()
            for mb in micro_batches
        ]

    def current_lr(self) -> float:
        if self._step_hparams is not None:
            return self._step_hparams.lr
        return float(self.scheduler.get_last_lr()[0])

    def set_step_hparams(self, adam: AdamHparams | None) -> None:
        self._step_hparams = adam

    can_reset_optimizer = True

    def reset_optimizer(self) -> None:
        self.optimizer.state.clear()  # AdamW builds a parameter's state again on its next step

    def _loss_scale(self) -> float:
        """What the gradients are multiplied by between forward_backward and optimizer_step."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def policy_and_reference(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        assert self.lora is None, "with LoRA the reference is the base model, which does not move"
        assert self.reference is not None, "no reference model was built (nothing reads one)"
        return self.model, self.reference

    def save_checkpoint(self, path: str) -> None:
        keep = self.lora.is_adapter if self.lora is not None else None  # the frozen base is model_path's
        save_sharded(path, self.model, self.optimizer, self.scheduler, self.scaler, keep=keep)
        if self.reference_in_checkpoint:
            save_module(os.path.join(path, REFERENCE_DIR), self.policy_and_reference()[1])

    def load_checkpoint(self, path: str) -> None:
        keep = self.lora.is_adapter if self.lora is not None else None
        load_sharded(path, self.model, self.optimizer, self.scheduler, self.scaler, keep=keep)
        if self.reference_in_checkpoint:
            load_module(os.path.join(path, REFERENCE_DIR), self.policy_and_reference()[1])

    # ------------------------------------------------------------------ full tensors
    # Subclasses gather the model's own state dict (a peft model's names with LoRA); these turn it
    # into the HF model's view (merged with LoRA) and the adapter's.

    @abstractmethod
    def _state(self, wanted: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(state-dict name, full tensor) of the model, in state-dict order, one at a time
        (collective); `wanted`: only the entries it accepts (a subclass may skip gathering the rest)."""

    @abstractmethod
    def _state_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(state-dict name, full gradient) of every parameter, zeros where the loss does not reach
        (collective), in `_state` order."""

    @abstractmethod
    def _state_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(state-dict name, dtype, full shape) of what `_state` yields."""

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._state() if self.lora is None else self.lora.merged(self._state())

    def iter_full_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        """With LoRA: the adapter's gradients, under peft's saved names (the base has none)."""
        return self._state_grads() if self.lora is None else self.lora.adapter_entries(self._state_grads())

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return self._state_specs() if self.lora is None else self.lora.specs(self._state_specs())

    def adapter_config(self) -> dict[str, Any] | None:
        return None if self.lora is None else self.lora.config

    def iter_adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.lora is not None, "iter_adapter_weights without a LoRA adapter"
        return self.lora.adapter_entries(self._state(wanted=self.lora.is_adapter))

    def iter_adapter_sync(self, with_base: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """Adapter-only sync's entries (weights/adapter.py): the adapter's factors and scales, and
        `with_base` the base (a transport's first sync)."""
        assert self.lora is not None, "adapter sync without a LoRA adapter"
        return self.lora.sync_entries(self._state(wanted=None if with_base else self.lora.is_adapter), with_base)

    def adapter_sync_specs(self, with_base: bool) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        assert self.lora is not None, "adapter sync without a LoRA adapter"
        specs = self._state_specs()
        return self.lora.sync_specs(specs if with_base else [s for s in specs if self.lora.is_adapter(s[0])], with_base)
