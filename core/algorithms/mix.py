"""MIX, as Trinity-RFT defines it (Pan et al. 2025, "Trinity-RFT", arXiv:2505.17826; its algorithm
development guide): one optimizer step on both the explored rollouts and expert demonstrations,

    J_mix = (1 - mu) * J_GRPO(rollouts) + mu * (1/B') sum_b (1/T'_b) sum_t log pi(o'_{b,t} | q'_b, o'_{b,<t}),

the expert part being the likelihood of expert responses (buffer.expert_taskset). rlcore takes the
policy part with the configured policy loss and aggregation, and the expert part as the mean NLL
over the step's expert tokens (Trinity's token-level SFT loss), as Trinity-RFT's code does, not the
equation's per-row mean (1/B' sum_b 1/T'_b sum_t): a long expert response weighs more. A train batch holds
algorithm.mix.expert_ratio expert rows (Trinity's expert_data_ratio): ceil(r / (1 - r)) expert rows
per rollout, added to the rollouts rather than taking their place, so the explored samples per
step stay those of the other algorithms.

`ExpertPass` brings the expert rows to the trainer's step (step_pass.py): the rows of
buffer.expert_taskset in seeded batches (batch k of a stage is the same on every rank and after a
resume), encoded as SFT encodes its rows (core/data/prompts.py), so the expert part of a mixed step
trains on exactly what an SFT stage would.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..batch import Sequence
from ..data.prompts import model_prompt_format
from ..data.taskset import TaskStream, load_tasks
from .aggregation import LossNorm
from .losses import Batch, PolicyLoss, SFTLoss
from .step_pass import PassContext, StepPass

KEY = "buffer.expert_taskset"

EXPERT = "expert"
"""The micro-batch field that marks the expert rows' micro-batches (all ones there)."""


def expert_rows_per_step(rollouts: int, ratio: float) -> int:
    """How many expert rows join `rollouts` explored ones so they make `ratio` of the train batch."""
    return math.ceil(rollouts * ratio / (1.0 - ratio))


class MixLoss:
    """The `LossFn` of a mixed step: (1 - mu) x the policy loss on rollout micro-batches, mu x the NLL
    on expert micro-batches (each normalised over its own part of the batch)."""

    def __init__(self, policy: PolicyLoss, expert: SFTLoss, mu: float):
        self.policy, self.expert, self.mu = policy, expert, mu
        self.needs_entropy = policy.needs_entropy

    @property
    def needs_reference(self) -> bool:
        return self.policy.needs_reference

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if EXPERT in batch:
            loss, metrics = self.expert(logprobs, None, batch)
            return self.mu * loss, {"mix/expert_nll": metrics["sft/loss"]}
        loss, metrics = self.policy(logprobs, entropy, batch)
        return (1.0 - self.mu) * loss, metrics


class ExpertPass(StepPass):
    name = "experts"

    def __init__(self, ctx: PassContext):
        super().__init__(ctx)
        cfg = ctx.cfg
        ts = cfg.buffer.expert_taskset
        assert ts is not None, "config validation asks mix for buffer.expert_taskset"
        self.per_step = expert_rows_per_step(ctx.rollouts_per_step, cfg.algorithm.mix.expert_ratio)
        tasks = load_tasks(ts, KEY)
        if len(tasks) < self.per_step:
            raise ValueError(
                f"{KEY}: {len(tasks)} rows, but each step takes {self.per_step} (algorithm.mix.expert_ratio "
                f"{cfg.algorithm.mix.expert_ratio} of a train batch with {ctx.rollouts_per_step} rollouts): give "
                "more rows or a lower algorithm.mix.expert_ratio"
            )
        self.stream = TaskStream(tasks, self.per_step, cfg.seed, ts.shuffle)
        self.format = model_prompt_format(cfg.model, ts.format.system_prompt)
        self.response_key, self.mu = ts.format.response_key, cfg.algorithm.mix.mu

    def sequences(self, step: int, first_index: int) -> list[Sequence]:
        """Batch `step` of the expert rows, indexed from `first_index` on (after the rollouts)."""
        out = []
        for j, t in enumerate(self.stream.batch(step)):
            if t.response is None:
                raise ValueError(f"{KEY}: task {t.task_id} has no response (column '{self.response_key}')")
            prompt, response = self.format.encode_sft_example(self.ctx.tokenizer, t.prompt, t.response)
            out.append(Sequence(prompt, response, index=first_index + j))
        return out

    def extra_batches(
        self, step: int, first_index: int, minis: int, metrics: dict[str, float]
    ) -> list[tuple[list[Batch], list[Sequence]]]:
        """This step's expert rows split over the mini-batches, as this rank's micro-batches (marked
        EXPERT) and the rows themselves."""
        rows = self.sequences(step, first_index)
        metrics["mix/expert_rows"] = float(len(rows))
        out = []
        for k in range(minis):
            part = rows[k * len(rows) // minis : (k + 1) * len(rows) // minis]
            mbs = self.ctx.micro(part)[0] if part else []
            for mb in mbs:
                mb[EXPERT] = torch.ones_like(mb["loss_mask"])
            out.append((mbs, part))
        return out

    def wrap_loss(
        self, loss: object, rows: list[Sequence], norm: Callable[[list[Sequence]], LossNorm]
    ) -> object:
        if not rows:
            return loss
        assert isinstance(loss, PolicyLoss), "mix trains a policy loss beside the expert rows"
        return MixLoss(loss, SFTLoss(norm(rows)), self.mu)
