"""On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning
from Self-Generated Mistakes", arXiv:2306.13649; Lu et al. 2025, "On-Policy Distillation", Thinking
Machines): the student samples, a teacher scores the tokens it sampled, and the per-token reverse KL
of the student from the teacher, estimated at the sampled token,

    KL_t = log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t)      (the k1 estimate, y ~ student)

is the learning signal: each token's advantage is -KL_t, so the policy gradient lowers the reverse
KL (mode-seeking: the student is pushed off what the teacher finds unlikely). `algorithm_type:
on_policy_distill` trains on it alone (no reward, distill_coef 1); `algorithm.distill_coef` c > 0
adds it to any RL algorithm's advantages, A_t + c * (-KL_t). The student's log-probs are the
recomputed old ones (pi_old: the policy before the update), the teacher's come from a frozen model
(`model.teacher_model_path`, same tokenizer) that the trainer world builds beside the policy, as it
builds a reference, or from an OpenAI-compatible service returning prompt log-probs
(`model.teacher_service`, teacher_service.py): `TeacherPass`, a step pass (step_pass.py) that
scores every micro-batch at the step's temperature and writes the advantages' distillation part.
"""

from __future__ import annotations

from typing import Any

import torch

from ..batch import Batch
from .scored import ScoredBatch
from .step_pass import PassContext, StepPass, StepRows

TEACHER = "teacher_logprobs"
"""The micro-batch field [B, T] of the teacher's log-prob of each token."""


def zero_advantages(batch: ScoredBatch) -> torch.Tensor:
    """[N] zeros: on_policy_distill has no reward advantage; the teacher's signal is all of it."""
    return torch.zeros_like(batch.rewards)


def reverse_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] the per-token reverse-KL estimate log pi_student - log pi_teacher on the mask, 0 off it."""
    return (student.float() - teacher.float()) * mask


class TeacherPass(StepPass):
    name = "teacher"

    def __init__(self, ctx: PassContext):
        super().__init__(ctx)
        cfg = ctx.cfg
        self.coef = float(cfg.algorithm.distill_coef or 0.0)
        self.teacher: Any
        if cfg.model.teacher_service:  # asked over HTTP by each rank (teacher_service.py)
            from .teacher_service import ServiceTeacher

            self.teacher = ServiceTeacher(cfg)
            return
        path = cfg.model.teacher_model_path
        assert path, "config validation asks distillation for a teacher"
        from transformers import AutoTokenizer

        if AutoTokenizer.from_pretrained(path).get_vocab() != ctx.tokenizer.get_vocab():
            raise ValueError(
                f"model.teacher_model_path: {path}'s tokenizer is not the student's ({ctx.model_path}): the teacher "
                "scores the student's token ids, so both need one vocabulary"
            )
        self.teacher = ctx.build_model(path, cfg.algorithm.optimizer)  # never stepped: frozen

    def score(self, mbs: list[Batch], temperature: float) -> None:
        for mb, lp in zip(mbs, self.teacher.compute_logprobs(mbs, temperature), strict=True):
            mb[TEACHER] = lp.float().cpu()

    def after_advantages(self, batch: ScoredBatch, rows: StepRows, metrics: dict[str, float]) -> None:
        kls = []
        for mb in rows.micro_batches():
            kl = reverse_kl(mb["old_logprobs"], mb[TEACHER], mb["loss_mask"])
            mb["advantages"] = mb["advantages"] - self.coef * kl
            kls.append(kl)
        mask = batch.need("response_mask", "distillation")
        per_token = rows.gather(kls, mask.shape[1])
        metrics["distill/reverse_kl"] = float(per_token.sum() / mask.sum().clamp(min=1))
        metrics["distill/coef"] = self.coef
