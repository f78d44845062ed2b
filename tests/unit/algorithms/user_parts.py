"""A user's algorithm parts, as a user's own module would hold them, named by import path in the
contract tests of the plug points (test_plugs.py, runtime/test_step_pass.py)."""

from __future__ import annotations

import dataclasses

import torch

from rlcore.core.algorithms import ALGORITHMS
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.algorithms.step_pass import PassContext, StepPass

CALLS: list[str] = []


def centred(batch: ScoredBatch) -> torch.Tensor:
    """[N] each reward less its group's mean (Dr. GRPO's advantage, written by hand)."""
    CALLS.append("centred")
    means = {g: float(torch.stack([r for r, h in zip(batch.rewards, batch.group_ids, strict=True) if h == g]).mean())
             for g in set(batch.group_ids)}  # fmt: skip
    return torch.stack([r - means[g] for r, g in zip(batch.rewards, batch.group_ids, strict=True)])


def vanilla_pg(logprobs, old, adv, mask, cfg):
    """REINFORCE's per-token terms: -A log pi, nothing clipped."""
    CALLS.append("vanilla_pg")
    return -adv * logprobs, torch.zeros_like(logprobs)


def two_values(batch: ScoredBatch) -> torch.Tensor:
    return torch.zeros(2)


def detached_pg(logprobs, old, adv, mask, cfg):
    return (-adv * logprobs).detach(), torch.zeros_like(logprobs)


NOT_AN_ALGORITHM = 42


class TeacherPass(StepPass):
    """Scores each micro-batch with a frozen copy of the policy and adds its mean log-prob to the
    step's metrics; records the hooks the trainer called, in order."""

    name = "teacher"

    def __init__(self, ctx: PassContext):
        super().__init__(ctx)
        self.model = ctx.build_model(ctx.model_path, ctx.cfg.algorithm.optimizer)
        CALLS.append("init")

    def score(self, mbs, temperature):
        for mb, lp in zip(mbs, self.model.compute_logprobs(mbs, 1.0), strict=True):
            mb["teacher_logprobs"] = lp
        CALLS.append("score")

    def before_advantages(self, batch, rows):
        width = batch.response_mask.shape[1]
        self.teacher = rows.gather([mb["teacher_logprobs"] for mb in rows.micro_batches()], width)
        CALLS.append("before_advantages")

    def after_advantages(self, batch, rows, metrics):
        mask = batch.response_mask
        metrics["teacher/logprob_mean"] = float((self.teacher * mask).sum() / mask.sum())
        CALLS.append("after_advantages")

    def update(self, mbs, norm):
        CALLS.append("update")
        return {}


TEACHER_GRPO = dataclasses.replace(ALGORITHMS["grpo"], passes=(f"{__name__}:TeacherPass",))
"""GRPO with a teacher beside it: an algorithm of one's own, by import path."""
