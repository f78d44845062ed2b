"""megatron-core training strategy: tensor-, pipeline- and data-parallel GPTModel.

The world is split by megatron-core's parallel_state into tensor-parallel (TP) groups inside
pipeline stages (PP) inside data-parallel (DP) replicas. Every rank of one replica trains on the
same share of the batch (`dp_rank`/`dp_size`); micro-batches flow through the stages by megatron's
pipeline schedule; Megatron DDP sums gradients over the DP ranks and the distributed optimizer
(ZeRO-1) keeps each DP rank's slice of the optimizer state. Weights enter and leave in HF names
through `mapping.py`, so the loop, weight sync and HF export never see Megatron's layout.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

from ...core.algorithms.logprob import at_temperature
from ...core.config.schema import LoraConfig, OptimizerConfig, TrainerConfig
from ...core.moe_routing import OWN_ROUTES, RoutingCounts
from ...core.strategy_capabilities import CAPABILITIES
from ..base import AdamHparams, Batch, LossFn, TrainingStrategy
from ..common.dist_utils import rank_device
from ..common.hf_model import freeze_routers, resolve_dtype, value_model_config
from ..common.schedule import lr_lambda
from ..common.sharded_checkpoint import REFERENCE_DIR
from . import compat, routing
from .full_tensors import FullTensors
from .logprobs import token_logprobs_and_entropy
from .lora import MegatronLora, is_adapter_key, load_adapter
from .mapping import (
    ROUTER,
    ModelDims,
    check_layout,
    hf_specs,
)
from .model import (
    HFWeights,
    build_gpt,
    freeze_padding_embedding,
    load_hf_weights,
    transformer_config,
    with_value_head,
)
from .optimizer import clip_grad_norm, gather_grad_shards, materialize_optimizer_state, restore_adam_steps
from .packing import PackedInput, schedule_inputs
from .setup import model_parallel, optimizer_config, parallel_sizes


class MegatronStrategy(TrainingStrategy):
    capabilities = CAPABILITIES["megatron"]

    def __init__(
        self,
        model_path: str,
        trainer_cfg: TrainerConfig,
        optimizer_cfg: OptimizerConfig,
        *,
        device: str,
        dtype: str,
        total_steps: int,
        with_reference: bool,
        seed: int,
        value_head: bool = False,
        head_bias: bool = True,
        lora: LoraConfig | None = None,
    ):
        from transformers import AutoConfig

        tp, pp, cp, ep = parallel_sizes(trainer_cfg)
        self.value_head = value_head
        self.packs_sequences, self.sequence_split = trainer_cfg.use_remove_padding, cp
        self._hf_config = (
            value_model_config(model_path) if value_head else AutoConfig.from_pretrained(model_path)
        )
        self.dims = ModelDims.from_hf_config(self._hf_config, value_head=value_head, head_bias=head_bias)
        check_layout(self.dims, tp, pp, ep, cp)
        adapter = None if lora is None else load_adapter(lora, model_path, self.dims, seed)
        self.grad_clip, self.optimizer_cfg = trainer_cfg.grad_clip, optimizer_cfg
        self._step_hparams: AdamHparams | None = None
        self._routes = RoutingCounts()  # what compute_logprobs replayed (routing.py)
        self._decays: list[bool] | None = None
        """Which parameter groups take weight decay (norms and biases do not), read once."""
        self.device = rank_device(device)  # the rank's world already chose it (init_world)
        self.dtype = resolve_dtype(dtype, self.device.type)

        model_parallel(tp, pp, cp, seed, ep)
        self.pp = pp
        self.is_last_stage = parallel_state.is_pipeline_last_stage()
        self.config = transformer_config(
            self.dims, tp, pp, self.dtype, on_cpu=self.device.type == "cpu", cp=cp,
            recompute=trainer_cfg.gradient_checkpointing, ep=ep,
        )  # fmt: skip
        hf = with_value_head(HFWeights(model_path), self.dims, seed) if value_head else HFWeights(model_path)
        module = self._on_device(build_gpt(self.config, self.dims, packed=self.packs_sequences))
        load_hf_weights(module, hf, self.dims)
        routing.install(module)
        compat.sum_expert_grads_over_tp(module, self.config)
        freeze_padding_embedding(module, self._hf_config.pad_token_id)
        if trainer_cfg.freeze_router:
            freeze_routers(module, "." + ROUTER)
        self.full = FullTensors(module, self.dims, tp, pp, ep, self.device)
        self.lora = None if adapter is None else MegatronLora(module, adapter, self.full, self.dtype)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=trainer_cfg.megatron.use_distributed_optimizer,
        )
        self.model = DistributedDataParallel(self.config, ddp_config, module)
        self.optimizer = get_megatron_optimizer(
            optimizer_config(optimizer_cfg, trainer_cfg, self.dtype, self.device),
            [self.model],
            config_overrides={},  # weight decay on every parameter, as the other strategies do
        )
        # float16: the schedule scales each micro-batch's loss by the optimizer's dynamic loss scale,
        # which prepare_grads() divides back out (without this it divided unscaled gradients)
        self.config.grad_scale_func = self.optimizer.scale_loss
        self._lr_multiplier = lr_lambda(optimizer_cfg, total_steps)
        self.step = 0  # optimizer steps taken: the lr schedule's position
        self._set_lr()
        self.reference = None
        if with_reference and self.lora is None:  # LoRA's reference: the adapter switched off
            self.reference = self._on_device(build_gpt(self.config, self.dims, packed=self.packs_sequences))
            load_hf_weights(self.reference, hf, self.dims)
            routing.install(self.reference)
            self.reference.requires_grad_(False)

    def _on_device(self, module: torch.nn.Module) -> torch.nn.Module:
        """The whole module on this rank's device in the compute dtype. megatron-core builds its
        linear layers there (config.params_dtype) but its torch norms on the CPU in float32
        (WrappedTorchNorm passes neither); Megatron-LM's training loop fixes that with .cuda() and
        Float16Module, which rlcore does not use. Left alone the norms would meet CUDA inputs, and
        the weight sync would find float32 tensors where it announced the compute dtype."""
        return module.to(device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ layout

    @property
    def dp_rank(self) -> int:
        return parallel_state.get_data_parallel_rank()

    @property
    def dp_size(self) -> int:
        return parallel_state.get_data_parallel_world_size()

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return parallel_state.get_data_parallel_group()

    # ------------------------------------------------------------------ training

    def forward_backward(
        self, micro_batches: list[Batch], loss_fn: LossFn, temperature: float
    ) -> dict[str, float]:
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run_schedule(
            self.model, micro_batches, partial(self._loss, loss_fn, temperature), forward_only=False
        )
        finalize_model_grads([self.model])  # sum over DP ranks; tied embeddings across stages
        totals: dict[str, float] = defaultdict(float)
        for metrics in outputs:
            for k, v in metrics.items():
                totals[k] += v
        return self._reduce_metrics(dict(totals))

    def optimizer_step(self) -> float:
        self._set_lr()
        overflow = self.optimizer.prepare_grads()  # float16: unscaled; an overflow lowers the scale
        # the pre-clip norm either way; an inf/nan norm clips nothing and the step is skipped
        # (a bad batch must not poison the weights), as on the other strategies
        grad_clip = self.grad_clip if self._step_hparams is None else self._step_hparams.grad_clip
        if grad_clip > 0:
            grad_norm = clip_grad_norm(self.optimizer, grad_clip)
        else:
            grad_norm = float(self.optimizer.get_grad_norm())
        if not overflow and math.isfinite(grad_norm):
            self.optimizer.step_with_ready_grads()
        self.step += 1
        return grad_norm

    def compute_logprobs(
        self, micro_batches: list[Batch], temperature: float, reference: bool = False
    ) -> list[torch.Tensor]:
        def logprobs(mb: Batch, packed: PackedInput | None, out: torch.Tensor) -> torch.Tensor:
            return self._logprobs(out, mb, packed, temperature, with_entropy=False)[0]

        if reference and self.lora is not None:  # the base model under the adapter
            with self.lora.off():
                return self._per_token(self.model, micro_batches, logprobs)
        model = self.reference if reference else self.model
        assert model is not None, "compute_logprobs(reference=True) without a reference model"
        return self._per_token(model, micro_batches, logprobs, None if reference else self._routes)

    def take_routing_counts(self) -> tuple[int, int]:
        return self._routes.take()

    def compute_values(self, micro_batches: list[Batch]) -> list[torch.Tensor]:
        assert self.value_head, "compute_values on a policy (build the strategy with value_head=True)"
        return self._per_token(self.model, micro_batches, lambda mb, packed, out: self._values(out, packed))

    @torch.no_grad()
    def _per_token(
        self,
        model: torch.nn.Module,
        micro_batches: list[Batch],
        of: Callable[[Batch, PackedInput | None, torch.Tensor], torch.Tensor],
        routes: RoutingCounts | None = None,
    ) -> list[torch.Tensor]:
        """A forward-only pass of megatron's schedule: `of(mb, packed, output)` [B, T] for each
        micro-batch, computed on the last stage and handed to every stage, in float32 on the CPU."""
        model.eval()

        def keep(mb: Batch, packed: PackedInput | None, output: torch.Tensor):
            values = of(mb, packed, output).float()
            return values.sum() * 0, torch.tensor(1), {"per_token": values}

        outputs = self._run_schedule(model, micro_batches, keep, forward_only=True, routes=routes)
        results = []
        for i, mb in enumerate(micro_batches):
            rows, width = mb["input_ids"].shape
            values = outputs[i]["per_token"][:rows, :width] if self.is_last_stage else None
            results.append(self._from_last_stage(values, (rows, width)).cpu())
        return results

    def current_lr(self) -> float:
        """The lr of the next optimizer step (what LambdaLR reports for the FSDP strategies)."""
        if self._step_hparams is not None:
            return self._step_hparams.lr
        return self.optimizer_cfg.lr * self._lr_multiplier(self.step)

    def set_step_hparams(self, adam: AdamHparams | None) -> None:
        self._step_hparams = adam

    def _set_lr(self) -> None:
        lr, adam = self.current_lr(), self._step_hparams
        groups = self.optimizer.param_groups
        if self._decays is None:
            self._decays = [bool(g.get("weight_decay", 0.0)) for g in groups]
        for group, decays in zip(groups, self._decays, strict=True):
            group["lr"] = lr
            if adam is not None:  # groups without weight decay (norms, biases) keep none
                group.update(betas=adam.betas, eps=adam.eps)
                if decays:
                    group["weight_decay"] = adam.weight_decay

    # ------------------------------------------------------------------ the schedule

    def _run_schedule(
        self, model: torch.nn.Module, micro_batches: list[Batch], loss_of: Callable, forward_only: bool,
        routes: RoutingCounts | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Run megatron's (pipeline) schedule over the micro-batches; returns, on the last stage, what
        `loss_of(mb, packed, output)` reported for each (`packed`: the micro-batch's packed input when
        the strategy packs sequences, else None). Pipelined stages exchange fixed-shape activations,
        so there every micro-batch is padded to the largest (padding rows carry no loss; a packed row
        gets a padding tail). Each micro-batch's routing records are replayed (routing.py; `routes`
        counts how many the router would have chosen otherwise)."""
        mbs = [{k: v.to(self.device) for k, v in mb.items()} for mb in micro_batches]
        sequence_parallel = self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1
        mbs, inputs = schedule_inputs(mbs, self.packs_sequences, self.pp > 1, sequence_parallel)
        first = inputs[0]  # the whole row's width (a context-parallel rank holds a part of it)
        rows, width = (1, first.row_width) if first is not None else mbs[0]["input_ids"].shape

        own_routes = self.records_routing and forward_only and routes is not None  # r2: the policy's pass
        balanced = bool(self.router_aux_loss_coef) and not forward_only and not self.value_head

        def forward_step(data_iterator: Iterator[tuple[Batch, PackedInput | None, Batch]], chunk: torch.nn.Module):
            mb, packed, original = next(data_iterator)
            if self.replays_routing:  # kept for the backward's recompute
                routing.set_records(chunk, mb, packed, routes)
            elif own_routes:
                routing.record(chunk)
            elif self.records_routing and OWN_ROUTES in mb:  # the update replays its old pass's routing
                routing.set_own(chunk, mb[OWN_ROUTES], self._routes)
            elif self.records_routing:  # a row without a record (mix's expert rows) routes by itself
                routing.clear(chunk)
            if balanced:
                routing.balance(chunk)
            if packed is not None:
                output = chunk(
                    packed.input_ids,
                    packed.position_ids,
                    attention_mask=None,
                    packed_seq_params=packed.params,
                )
            else:
                positions = torch.arange(mb["input_ids"].shape[1], device=self.device).expand_as(
                    mb["input_ids"]
                )
                output = chunk(mb["input_ids"], positions, attention_mask=None)
            if own_routes:
                original[OWN_ROUTES] = routing.recorded(chunk).cpu()
            if balanced:  # this micro-batch's share of the batch's mean load-balancing loss
                aux = routing.balance_loss(chunk, self._token_mask(mb, packed)) / (len(mbs) * self.dp_size)
                return output, partial(self._with_aux, partial(loss_of, mb, packed), aux)
            return output, partial(loss_of, mb, packed)

        try:
            return get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(list(zip(mbs, inputs, micro_batches, strict=True))),
                model=[model],
                num_microbatches=len(mbs),
                seq_length=width,
                micro_batch_size=rows,
                forward_only=forward_only,
            )
        finally:
            routing.clear(model)

    def _logprobs(
        self,
        logits: torch.Tensor,
        mb: Batch,
        packed: PackedInput | None,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs [B, T] from [B, T, V_local] logits (a packed row's [1, row / C, V_local],
        this rank's part of it), position 0 being 0 (as in backends/common/hf_model.forward_logprobs)."""
        if packed is not None:
            logits = packed.tempered(logits[0], temperature, mb)
            lp, ent = token_logprobs_and_entropy(logits, packed.targets, self.dims.vocab, with_entropy)
            return packed.to_rows(lp), None if ent is None else packed.to_rows(ent)
        logits = at_temperature(logits[:, :-1], temperature, mb)
        lp, ent = token_logprobs_and_entropy(logits, mb["input_ids"][:, 1:], self.dims.vocab, with_entropy)
        zeros = lp.new_zeros((lp.shape[0], 1))
        return torch.cat([zeros, lp], dim=1), None if ent is None else torch.cat([zeros, ent], dim=1)

    @staticmethod
    def _values(output: torch.Tensor, packed: PackedInput | None) -> torch.Tensor:
        """A critic's per-token values [B, T] from its head's [B, T, 1] output, in the layout of
        `_logprobs` (position t: the value of the state before input_ids[t]; position 0 is 0)."""
        if packed is not None:
            return packed.to_rows(output[0, :, 0].float())
        values = output[:, :-1, 0].float()
        return torch.cat([values.new_zeros((values.shape[0], 1)), values], dim=1)

    def _with_aux(self, inner: Callable, aux: torch.Tensor, output: torch.Tensor):
        """`inner`'s (loss, count, metrics) with trainer.router_aux_loss_coef x `aux` added."""
        loss, count, metrics = inner(output)
        metrics = {**metrics, "actor/router_aux_loss": float(aux)}
        return loss + self.router_aux_loss_coef * aux, count, metrics

    @staticmethod
    def _token_mask(mb: Batch, packed: PackedInput | None) -> torch.Tensor:
        """[tokens] the real tokens of a micro-batch in the order its routers see them: the packed
        row's positions of real tokens, or padded rows sequence-major."""
        if packed is None:
            return mb["attention_mask"].t().flatten().bool()
        mask = torch.zeros(packed.row_width, dtype=torch.bool, device=packed.keep.device)
        mask[packed.keep] = True
        return mask

    def _loss(
        self, loss_fn: LossFn, temperature: float, mb: Batch, packed: PackedInput | None, output: torch.Tensor
    ):
        if self.value_head:
            loss, metrics = loss_fn(self._values(output, packed), None, mb)
        else:
            logprobs, entropy = self._logprobs(output, mb, packed, temperature, loss_fn.needs_entropy)
            loss, metrics = loss_fn(logprobs, entropy, mb)
        # (loss, token count, metrics): with calculate_per_token_loss the schedule does not rescale
        return loss, torch.tensor(1, dtype=torch.int), metrics

    # ------------------------------------------------------------------ cross-stage plumbing

    def _reduce_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """Sum over DP replicas on the last stage, then hand the result to every stage."""
        box: list[Any] = [None]
        if self.is_last_stage:
            keys = sorted(totals)
            t = torch.tensor([totals[k] for k in keys], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, group=self.dp_group)
            box[0] = dict(zip(keys, t.tolist(), strict=True))
        if self.pp > 1:
            dist.broadcast_object_list(
                box, group=parallel_state.get_pipeline_model_parallel_group(), group_src=self.pp - 1
            )
        return box[0]

    def _from_last_stage(self, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        return self.full.from_stage(tensor, shape, torch.float32, self.pp - 1)

    # ------------------------------------------------------------------ weights

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.lora is not None:
            return self.lora.layout.merged(self.lora.state(with_base=True))
        return self.full.tensors(lambda p: p, self.dtype)

    def iter_full_grads(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.model.ddp_config.use_distributed_optimizer:
            gather_grad_shards(self.model)
        scale = float(self.optimizer.get_loss_scale())  # float16's loss scale, 1 otherwise

        def grad(p: torch.nn.Parameter) -> torch.Tensor:  # DDP-owned, fp32; a frozen router has none
            return p.main_grad / scale if p.requires_grad else torch.zeros_like(p, dtype=torch.float32)  # type: ignore[attr-defined]

        if self.lora is not None:  # the adapter's (the base has none)
            return self.lora.layout.adapter_entries(self.lora.factors(grad, torch.float32))
        return self.full.tensors(grad, torch.float32)

    def weight_specs(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(name, self.dtype, tuple(shape)) for name, shape in hf_specs(self.dims)]

    def hf_config(self) -> Any:
        return self._hf_config

    # ------------------------------------------------------------------ LoRA's views (lora.py)

    def adapter_config(self) -> dict[str, Any] | None:
        return None if self.lora is None else self.lora.layout.config

    def iter_adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.lora is not None, "iter_adapter_weights without a LoRA adapter"
        return self.lora.layout.adapter_entries(self.lora.state(with_base=False))

    def iter_adapter_sync(self, with_base: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """Adapter-only sync's entries (weights/adapter.py), as the PyTorch-native strategies send them."""
        assert self.lora is not None, "adapter sync without a LoRA adapter"
        return self.lora.layout.sync_entries(self.lora.state(with_base), with_base)

    def adapter_sync_specs(self, with_base: bool) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        assert self.lora is not None, "adapter sync without a LoRA adapter"
        return self.lora.layout.sync_specs(self.lora.specs(self.weight_specs() if with_base else None), with_base)

    # ------------------------------------------------------------------ checkpoints

    def _sharded_state(self, is_loading: bool) -> dict[str, Any]:
        """Every rank's own shards, written and read in parallel by dist_checkpointing (torch DCP
        underneath). The optimizer state is saved as the distributed optimizer holds it: a resume
        may change the number of data-parallel ranks, not the TP/PP layout."""
        model_sd = self.model.module.sharded_state_dict()
        if self.lora is not None:  # the frozen base is model_path's
            model_sd = {k: v for k, v in model_sd.items() if is_adapter_key(k)}
        optim_sd = self.optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": "dp_reshardable"}
        )
        return {"model": model_sd, "optimizer": optim_sd}

    def policy_and_reference(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        assert self.lora is None, "with LoRA the reference is the base model, which does not move"
        assert self.reference is not None, "no reference model was built (nothing reads one)"
        return self.model.module, self.reference

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        compat.checkpoint_results_in_process()
        dist.barrier()
        dist_checkpointing.save(self._sharded_state(is_loading=False), path)
        if self.reference_in_checkpoint:
            ref_dir = os.path.join(path, REFERENCE_DIR)
            os.makedirs(ref_dir, exist_ok=True)
            dist.barrier()
            reference: Any = self.policy_and_reference()[1]  # a GPTModel
            dist_checkpointing.save({"model": reference.sharded_state_dict()}, ref_dir)
        if dist.get_rank() == 0:
            torch.save({"step": self.step}, os.path.join(path, "scheduler.pt"))
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        materialize_optimizer_state(self.optimizer)
        state = dist_checkpointing.load(self._sharded_state(is_loading=True), path)
        with torch.no_grad():  # fp32 main params are views of the (leaf) model params
            loaded = self.model.module.load_state_dict(state["model"], strict=self.lora is None)
            assert not [k for k in loaded.missing_keys if is_adapter_key(k)], loaded.missing_keys
            self.optimizer.load_state_dict(state["optimizer"])
        restore_adam_steps(self.optimizer)
        if self.reference_in_checkpoint:
            reference: Any = self.policy_and_reference()[1]  # a GPTModel
            ref_state = dist_checkpointing.load(
                {"model": reference.sharded_state_dict()}, os.path.join(path, REFERENCE_DIR)
            )
            with torch.no_grad():
                reference.load_state_dict(ref_state["model"])
        self.step = torch.load(os.path.join(path, "scheduler.pt"), weights_only=True)["step"]
        self._set_lr()
