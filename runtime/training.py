"""The training side of one stage, as every trainer rank holds it: the strategy, the optimizer
state and counters, and the algorithm step on scored experiences.

    train_experiences(exps)   reference / old log-probs (and a critic's values), the algorithm's
                              rewards and advantages, then one optimizer step per mini-batch
    train_sequences(seqs)     gradients of a loss over given sequences (ForwardBackward)
    logprobs(seqs)            response log-probs of given sequences (ComputeLogprobs, the probe)

Every method is collective: all ranks call it with the same arguments (trainer_world.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..backends import STRATEGIES
from ..backends.base import AdamHparams, TrainingStrategy
from ..core.algorithms import STEP_PASSES, trains_on, trains_reward_model, with_preset
from ..core.algorithms.aggregation import LossNorm
from ..core.algorithms.correction import MismatchStats, correct, reject
from ..core.algorithms.dpo import SequenceSurrogate, dpo_pairs
from ..core.algorithms.losses import build_loss
from ..core.algorithms.step_pass import PassContext, StepPass, WithPasses, timed
from ..core.batch import (
    Batch,
    Sequence,
    deal,
    equalize,
    gathered_by_index,
    micro_batches,
    plan_micro_batches,
    shard,
)
from ..core.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from ..core.config import RLCoreConfig
from ..core.config.plan import Passes, filled, plan_stage
from ..core.hf_export import ADAPTER_DIR, HF_DIR, export_adapter, export_hf
from ..core.step_metrics import LogprobGap, mean_dicts, rollout_metrics
from ..core.types import Experience, episode_starts
from . import reward_training, scoring
from .step_sizes import experiences_per_step, max_response_len, mini_batches, plan_steps

POLICY_TERMS = {"grpo": "ppo_clip", "ppo": "ppo_clip", "importance_sampling": "importance_sampling",
                "cispo": "cispo", "gspo": "gspo"}  # fmt: skip
"""The policy losses train_sequences takes by name -> their terms (algorithm.policy_loss_fn)."""


@dataclass
class SequenceSpec:
    """One training sequence; per-token lists have the response's length."""

    prompt: list[int]
    response: list[int]
    loss_mask: list[float]
    advantages: list[float]
    old_logprobs: list[float] | None


def sequence_spec(
    prompt: list[int], response: list[int], loss_mask: list[float], advantages: list[float],
    old_logprobs: list[float] | None,
) -> SequenceSpec:  # fmt: skip
    """A checked sequence in the form the world trains on: an empty loss mask trains every response
    token, but nothing predicts a first token without a prompt; one advantage stands for all."""
    n = len(response)
    mask = list(loss_mask) or [1.0] * n
    if not prompt:
        mask[0] = 0.0
    if len(advantages) == 1:
        advantages = advantages * n
    return SequenceSpec(prompt, response, mask, list(advantages) or [0.0] * n, old_logprobs)


def loss_norm(rows: list[Sequence], max_response_len: int) -> LossNorm:
    """The loss normaliser over the rows that train (a mini-batch may have none left): their trained
    tokens, and the rows with at least one (a row masked importance sampling rejected whole has none)."""
    tokens = [s.trained_tokens for s in rows]
    return LossNorm(
        num_tokens=float(sum(tokens)) or 1.0, num_seqs=float(sum(1 for t in tokens if t > 0)) or 1.0,
        max_response_len=max_response_len,
    )  # fmt: skip


def reject_tokens(local: scoring.Local, seqs: list[Sequence], group: dist.ProcessGroup | None) -> None:
    """Masked importance sampling, as verl's rejection sampling (core/algorithms/correction.py): the
    tokens it rejected leave every micro-batch's loss mask and their rows' Sequence.loss_mask, which
    loss_norm counts. Each data-parallel rank decided its own rows; the masks are gathered, so every
    rank and every micro-batch divides by the same post-rejection counts."""
    mbs = [mb for m, _ in local for mb in m]
    for mb in mbs:
        reject(mb)
    width = max(len(s.response_ids) for s in seqs)
    kept = scoring.aligned(local, seqs, [mb["loss_mask"] for mb in mbs], width, group)
    for i, s in enumerate(seqs):
        s.loss_mask = [int(v) for v in kept[i, : len(s.response_ids)].tolist()]


class StageTraining:
    def __init__(
        self, cfg: RLCoreConfig, stage_dir: str, model_path: str, device: str, total_steps: int,
        passes: Passes | None = None,
    ):  # fmt: skip
        """`total_steps`: optimizer steps the lr schedule spans; `passes`: what the stage's plan says
        a step computes beyond the policy's (Configure hands it over; a config made by hand, in a
        test or a benchmark, is planned here)."""
        from transformers import AutoTokenizer

        self.cfg, self.stage_dir, self.model_path, self.device = cfg, stage_dir, model_path, device
        self.total_steps = total_steps
        algo = cfg.algorithm
        self.explores = trains_on(algo) == "rollouts"
        self.reward_model = trains_reward_model(algo)
        """The stage trains a reward model (reward_training.py): a value head without a bias."""
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_token_id = tokenizer.pad_token_id
        ts = cfg.buffer.explorer_input.taskset
        self.temperature = ts.rollout_args.temperature or 1.0
        self.max_response_len = max_response_len(cfg)
        self.train_batch = plan_steps(cfg, cfg.buffer.batch_size)[0]
        self.algo = with_preset(algo)
        passes = passes or plan_stage(filled(cfg)).passes
        rollouts = experiences_per_step(cfg)
        self.updates_per_step = max(rollouts // self.train_batch, 1)
        self.needs_ref = passes.reference
        self.syncs_ref = self.needs_ref and algo.sync_ref_model
        self.strategy = self._build_model(
            model_path, algo.optimizer, value_head=self.reward_model, head_bias=not self.reward_model,
            with_reference=self.needs_ref,
            lora=cfg.model.lora_configs[0] if cfg.model.lora_configs else None,
        )  # fmt: skip
        self.strategy.reference_in_checkpoint = self.syncs_ref  # it moves: checkpoints keep it
        self.strategy.replays_routing = algo.router_replay == "r3"  # the policy only (base.py)
        self.strategy.records_routing = algo.router_replay == "r2"
        self.strategy.router_aux_loss_coef = cfg.trainer.router_aux_loss_coef
        ctx = PassContext(
            cfg, model_path, device, total_steps, tokenizer, rollouts, self.max_response_len,
            build_model=self._build_model, micro=self.micro,
        )  # fmt: skip
        self.passes: list[StepPass] = [
            STEP_PASSES.resolve_class(name, StepPass, "algorithm pass")(ctx) for name in passes.extra
        ]
        self.step = scoring.AlgorithmStep(self.algo, self.max_response_len, self.passes)
        self.state = TrainerState()

    def _build_model(
        self, path: str, optim: Any, value_head: bool = False, with_reference: bool = False, lora: Any = None,
        head_bias: bool = True,
    ) -> Any:  # fmt: skip
        """A model of the stage's strategy (trainer.strategy) from `path` with its own optimizer."""
        cfg = self.cfg
        return STRATEGIES.resolve(cfg.trainer.strategy)(
            path, cfg.trainer, optim, device=self.device, dtype=cfg.model.dtype, total_steps=self.total_steps,
            with_reference=with_reference, seed=cfg.seed, value_head=value_head, head_bias=head_bias, lora=lora,
        )  # fmt: skip

    # ------------------------------------------------------------------ the algorithm step

    def train_experiences(self, exps: list[Experience]) -> dict[str, float]:
        """One RL step on scored experiences: old and reference log-probs, the rewards the algorithm
        sees, its advantages, then one optimizer step per mini-batch."""
        algo = self.algo
        temperature, each = self.step_temperature(exps)
        seqs = [
            Sequence(
                e.prompt_token_ids, e.response_token_ids, list(e.logprobs), index=i, loss_mask=e.loss_mask or None,
                temperature=None if each is None else each[i], routed_experts=e.routed_experts,
            )
            for i, e in enumerate(exps)
        ]  # fmt: skip
        keep = self.step.trained(exps)

        # Log-prob passes happen before any update, on this rank's share of every mini-batch.
        minis = [seqs[r.start : r.stop] for r in mini_batches(len(seqs), self.cfg, episode_starts(exps))]
        local = [self.micro(m) for m in minis]
        scoring.mask_rows(local, keep)
        timers: dict[str, float] = {}
        metrics = self._score(local, temperature, timers)
        self.step.advantages(exps, keep, scoring.LocalRows(local, seqs, self.strategy.dp_group), metrics)
        if algo.rollout_correction.kind == "mis":  # rewards and advantages saw every sampled token
            reject_tokens(local, seqs, self.strategy.dp_group)
        extra = self._extra_batches(len(seqs), len(minis), metrics)

        t1 = time.perf_counter()
        updates = [
            self._update(mbs, [s for s in mini if keep[s.index]], timers, temperature, more)
            for (mbs, _), mini, more in zip(local, minis, extra, strict=True)
        ]
        metrics.update(mean_dicts(updates))
        if algo.router_replay == "r2":  # the share of replayed routes the updated router would have changed
            metrics.update(self._routing_share("actor/routing_drift"))
        metrics.update(rollout_metrics(exps))
        metrics.update(timers)
        metrics["perf/train_s"] = time.perf_counter() - t1
        trained = seqs + [s for _, more in extra for s in more]  # a pass's rows train too (mix's experts)
        metrics["perf/tokens"] = float(sum(s.length for s in trained))
        return metrics

    def _score(self, local: scoring.Local, temperature: float, timers: dict[str, float]) -> dict[str, float]:
        """The log-prob passes, before any update, on this rank's micro-batches: the reference's, the
        recomputed old log-probs (with the engine's against them: logprob_diff, and the rollout
        correction's weights) and the step passes' (a critic's values)."""
        algo, rc = self.algo, self.algo.rollout_correction
        gap = LogprobGap()  # the engine's log-probs (in old_logprobs until recomputed) against ours
        mismatch = MismatchStats() if rc.kind != "none" else None
        for mbs, _ in local:
            if self.needs_ref:
                with timed(timers, "perf/ref_logprobs_s"):
                    ref = self.strategy.compute_logprobs(mbs, temperature, reference=True)
                for mb, lp in zip(mbs, ref, strict=True):
                    mb["ref_logprobs"] = lp
            if algo.do_old_log_prob_compute:
                with timed(timers, "perf/old_logprobs_s"):
                    old = self.strategy.compute_logprobs(mbs, temperature)
                for mb, lp in zip(mbs, old, strict=True):
                    engine, mask = mb["old_logprobs"], mb["loss_mask"]
                    gap.add(engine, lp, mask)
                    if mismatch is not None:
                        mismatch.add(lp, engine, mask, correct(mb, lp, rc))
                    mb["old_logprobs"] = lp
            for p in self.passes:
                with timed(timers, f"perf/{p.name}_score_s"):
                    p.score(mbs, temperature)
        metrics = gap.metrics(self.strategy.dp_group) if algo.do_old_log_prob_compute else {}
        if algo.router_replay == "r3" and algo.do_old_log_prob_compute:
            # the share of replayed token routes the trainer would have chosen otherwise
            metrics.update(self._routing_share("rollout/routing_mismatch"))
        if mismatch is not None:
            metrics.update(mismatch.metrics(self.strategy.dp_group, rc.kind))
        return metrics

    def _routing_share(self, name: str) -> dict[str, float]:
        """{name: the share of the token routes replayed since the last call that the router would
        have chosen otherwise} over the world (sequence-parallel ranks replay slices of one row)."""
        routes = torch.tensor(self.strategy.take_routing_counts(), dtype=torch.float64)
        dist.all_reduce(routes)
        return {name: float(routes[0] / routes[1])} if routes[1] else {}

    def step_temperature(self, exps: list[Experience]) -> tuple[float, list[float] | None]:
        """The temperature the step's experiences were sampled at, and each one's when they differ (a
        mixture of tasksets that sample differently: every row is scored at its own). One that
        recorded none (an agent's episode) counts as the training taskset's."""
        each = [self.temperature if e.temperature is None else e.temperature for e in exps]
        if len(set(each)) <= 1:
            return (each[0] if each else self.temperature), None
        return self.temperature, each

    def _extra_batches(
        self, first_index: int, minis: int, metrics: dict[str, float]
    ) -> list[tuple[list[Batch], list[Sequence]]]:
        """Per mini-batch, the micro-batches and rows the step passes add to the experiences' (mix:
        its expert rows), indexed from `first_index` on."""
        out: list[tuple[list[Batch], list[Sequence]]] = [([], [])] * minis
        step = self.state.global_step // self.updates_per_step
        for p in self.passes:
            more = p.extra_batches(step, first_index, minis, metrics)
            out = [(mbs + m, rows + r) for (mbs, rows), (m, r) in zip(out, more, strict=True)]
            first_index += sum(len(r) for _, r in more)
        return out

    def _norm(self, rows: list[Sequence]) -> LossNorm:
        return loss_norm(rows, self.max_response_len)

    def _update(
        self, mbs: list[Batch], mini: list[Sequence], timers: dict[str, float], temperature: float,
        extra: tuple[list[Batch], list[Sequence]] = ([], []),
    ) -> dict[str, float]:  # fmt: skip
        """Forward/backward of the loss over one mini-batch (with the step passes' rows: mix's
        expert rows), then an optimizer step; a pass with a model of its own (PPO's critic) takes
        its step first, and may hold the policy back (critic.critic_warmup)."""
        norm = self._norm(mini)
        metrics: dict[str, float] = {}
        for p in self.passes:
            with timed(timers, f"perf/{p.name}_update_s"):
                metrics.update(p.update(mbs, norm))
        if any(p.holds_policy(self.state.global_step) for p in self.passes):
            self.state.global_step += 1
            return metrics
        extra_mbs, extra_rows = extra
        loss_fn: Any = build_loss(self.algo, norm)
        for p in self.passes:
            loss_fn = p.wrap_loss(loss_fn, extra_rows, self._norm)
        with timed(timers, "perf/forward_backward_s"):
            metrics.update(self.strategy.forward_backward(mbs + extra_mbs, loss_fn, temperature))
        with timed(timers, "perf/optimizer_s"):
            grad_norm, lr = self.optimizer_step()
        metrics["actor/grad_norm"], metrics["actor/lr"] = grad_norm, lr
        if self.syncs_ref and self.state.global_step % self.algo.ref_model_sync_steps == 0:
            self.strategy.sync_reference(self.algo.ref_model_mixup_alpha)
            metrics["actor/ref_synced"] = 1.0
        return metrics

    # ------------------------------------------------------------------ building blocks

    def optimizer_step(self, adam: AdamHparams | None = None) -> tuple[float, float]:
        """Clip, step and zero (with `adam`'s hyperparameters in place of the configured ones, when
        given); returns the gradient norm and the learning rate the step used."""
        self.strategy.set_step_hparams(adam)
        lr = self.strategy.current_lr()  # the scheduler moves on inside optimizer_step
        grad_norm = self.strategy.optimizer_step()
        self.state.global_step += 1
        return grad_norm, lr

    def train_sequences(
        self, specs: list[SequenceSpec], loss: str, temperature: float, normalize_tokens: float,
        clip: tuple[float | None, float | None] = (None, None),
    ) -> dict[str, Any]:  # fmt: skip
        """Accumulate the gradients of `loss` (cross_entropy, dpo, a policy loss: POLICY_TERMS, or
        a reward model's bradley_terry) over `specs`; no optimizer step. `clip`: the policy loss's (clip_ratio_low, clip_ratio_high),
        None for the configured one."""
        if self.reward_model != (loss == "bradley_terry"):
            raise ValueError(
                f"loss {loss} on a stage that trains a {'reward model' if self.reward_model else 'policy'}: "
                "bradley_terry trains a reward model (algorithm_type reward_model), the other losses a policy"
            )
        if loss == "dpo":
            return self._dpo(specs, temperature)
        if loss == "bradley_terry":
            return reward_training.train_pairs(self, specs, self.algo.reward_model.center_coef)
        mbs = self.spec_batches(specs)
        algo = self.cfg.algorithm
        if loss == "cross_entropy":
            algo = dataclasses.replace(algo, algorithm_type="sft")
        else:  # the KL term needs the reference model, which only an RL config builds
            low, high = clip
            algo = dataclasses.replace(
                algo,
                algorithm_type="grpo",
                policy_loss_fn=POLICY_TERMS[loss],
                kl_loss_fn=algo.kl_loss_fn if self.needs_ref else "none",
                clip_ratio_low=algo.clip_ratio_low if low is None else low,
                clip_ratio_high=algo.clip_ratio_high if high is None else high,
            )
        num_tokens = sum(sum(s.loss_mask) for s in specs)
        norm = LossNorm(
            num_tokens=normalize_tokens or num_tokens,
            num_seqs=float(sum(1 for s in specs if sum(s.loss_mask) > 0)),
            max_response_len=self.max_response_len,
        )
        loss_fn = build_loss(algo, norm)
        if loss_fn.needs_reference:
            ref = self.strategy.compute_logprobs(mbs, temperature, reference=True)
            for mb, lp in zip(mbs, ref, strict=True):
                mb["ref_logprobs"] = lp
        metrics = self.strategy.forward_backward(mbs, loss_fn, temperature)
        value = metrics["sft/loss"] if loss == "cross_entropy" else metrics["actor/loss"]
        return {"loss": value, "metrics": metrics, "num_tokens": int(round(num_tokens))}

    def spec_batches(self, specs: list[SequenceSpec]) -> list[Batch]:
        """This rank's micro-batches of `specs`, with their loss masks and advantages."""
        seqs = [Sequence(s.prompt, s.response, s.old_logprobs, index=i) for i, s in enumerate(specs)]
        mbs, rows = self.micro(seqs)
        for mb, idx in zip(mbs, rows, strict=True):
            for r, i in enumerate(idx):  # the batch's right-padded layout: response at [p, p + n)
                s = specs[i]
                p, n = len(s.prompt), len(s.response)
                mask = torch.tensor(s.loss_mask, dtype=torch.float32)
                mb["loss_mask"][r, p : p + n] = mask
                mb["advantages"][r, p : p + n] = mask * torch.tensor(s.advantages, dtype=torch.float32)
        return mbs

    def _dpo(self, specs: list[SequenceSpec], temperature: float) -> dict[str, Any]:
        """DPO's gradients over (chosen, rejected) pairs, pair k at 2k and 2k + 1: both responses
        scored by the policy and the reference, then the surrogate of core/algorithms/dpo.py."""
        assert len(specs) % 2 == 0, "dpo takes (chosen, rejected) pairs"

        def summed(lps: list[list[float]]) -> torch.Tensor:
            return torch.tensor(
                [sum(lp * m for lp, m in zip(lps_i, s.loss_mask, strict=True)) for lps_i, s in zip(lps, specs, strict=True)],
                dtype=torch.float64,
            )  # fmt: skip

        policy = summed(self.logprobs(specs, temperature, reference=False))
        reference = summed(self.logprobs(specs, temperature, reference=True))
        algo = self.algo
        chosen_lengths = torch.tensor([sum(s.loss_mask) for s in specs[0::2]], dtype=torch.float64)
        pairs = dpo_pairs(
            policy, reference, algo.dpo.beta, algo.dpo.label_smoothing, algo.dpo.nll_coef, chosen_lengths,
            algo.dpo.nll_norm,
        )  # fmt: skip
        weighted = [
            dataclasses.replace(s, advantages=[w] * len(s.response))
            for s, w in zip(specs, pairs.weights.tolist(), strict=True)
        ]
        metrics = self.strategy.forward_backward(
            self.spec_batches(weighted), SequenceSurrogate(), temperature
        )
        metrics.update(pairs.metrics)
        num_tokens = sum(sum(s.loss_mask) for s in specs)
        return {"loss": pairs.loss, "metrics": metrics, "num_tokens": int(round(num_tokens))}

    def logprobs(self, specs: list[SequenceSpec], temperature: float, reference: bool) -> list[list[float]]:
        """Each rank scores its data-parallel share; every rank returns all sequences' response
        log-probs, in order (a reward model's stage: each sequence's score, one value)."""
        if self.reward_model:
            return [[v] for v in reward_training.sequence_scores(self, specs)]
        seqs = [Sequence(s.prompt, s.response, None, index=i) for i, s in enumerate(specs)]
        mbs, rows = self.micro(seqs)
        mine: dict[int, list[float]] = {}
        for lp, idx in zip(self.strategy.compute_logprobs(mbs, temperature, reference), rows, strict=True):
            for r, i in enumerate(idx):  # the response sits at columns [p, p + n) of its row
                p, n = len(specs[i].prompt), len(specs[i].response)
                mine[i] = lp[r, p : p + n].float().tolist()
        return gathered_by_index(mine, len(specs))

    def micro(self, mini: list[Sequence]) -> tuple[list[Batch], list[list[int]]]:
        """This rank's share of a mini-batch as micro-batches, with the same count on every rank.
        Ranks that hold parts of one model replica (tensor/pipeline parallel) share one share."""
        trainer, strategy = self.cfg.trainer, self.strategy
        if trainer.balance_batch:
            mine = deal(mini, strategy.dp_size)[strategy.dp_rank]
        else:
            mine = shard(mini, strategy.dp_rank, strategy.dp_size)
        groups = plan_micro_batches(
            mine,
            trainer.max_token_len_per_gpu * strategy.sequence_split,  # a rank holds 1/split of a row
            packed=strategy.packs_sequences,
            by_length=trainer.balance_batch,
        )
        count = torch.tensor([len(groups)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        groups = equalize(groups, int(count))
        mbs = micro_batches(groups, self.pad_token_id, template=mini[0])
        return mbs, [[s.index for s in g] for g in groups]

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpointed(self) -> TrainingStrategy | WithPasses:
        """What a checkpoint's model/ folder holds: the policy (and the passes' state: a critic)."""
        return WithPasses(self.strategy, self.passes) if any(p.folder for p in self.passes) else self.strategy

    def save(self, export: bool, explore_step: int) -> str:
        """A checkpoint of this stage, with an HF export in its hf/ folder when `export` (LoRA: the
        merged model) and, with LoRA, the adapter in peft's format in adapter/."""
        self.state.explore_step = explore_step
        self.state.kl_ctrl = self.step.kl_ctrl.state_dict()
        adapter = self.strategy.adapter_config()
        write = dist.get_rank() == 0

        def exports(folder: str) -> None:
            if adapter is not None:
                export_adapter(
                    self.strategy.iter_adapter_weights(), os.path.join(folder, ADAPTER_DIR), adapter, write
                )
            if export:
                export_hf(
                    self.strategy.iter_full_weights(), os.path.join(folder, HF_DIR), self.export_config(),
                    self.model_path, write,
                )  # fmt: skip

        return save_checkpoint(
            self.stage_dir, self.checkpointed, self.state, self.cfg.trainer.max_checkpoints_to_keep,
            exports if export or adapter is not None else None,
        )  # fmt: skip

    def export_config(self) -> Any:
        """The HF config an export writes: the strategy's, a reward model's named as its family's
        sequence classifier (it loads as AutoModelForSequenceClassification)."""
        config = self.strategy.hf_config()
        if self.reward_model:
            return reward_training.sequence_classifier_config(config, self.pad_token_id)
        return config

    def load(self, path: str) -> TrainerState:
        self.state = load_checkpoint(path, self.checkpointed)
        self.step.kl_ctrl.load_state_dict(self.state.kl_ctrl)
        return self.state
