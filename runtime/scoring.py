"""From scored experiences to advantages in the trainer's micro-batches: the rewards an algorithm
sees (DAPO's overlong shaping, the KL penalty in the reward), its ScoredBatch, and the advantages
written back into each micro-batch row.

Micro-batches hold whole rows ([B, L]: prompt then response, right-padded); a ScoredBatch holds
response-aligned [N, T] tensors. Every rank knows every experience, but each data-parallel rank
computed log-probs for its own rows only: `aligned` sums their parts over the data-parallel group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.algorithms.dapo import overlong_penalty, truncated
from ..core.algorithms.kl import kl_estimate
from ..core.algorithms.scored import ScoredBatch
from ..core.batch import Batch, Sequence
from ..core.config.schema import AlgorithmConfig
from ..core.types import Experience

Local = list[tuple[list[Batch], list[list[int]]]]
"""Per mini-batch: this rank's micro-batches and, per micro-batch, the global index of each row."""


def trained(exps: list[Experience], overlong_filter: bool) -> list[bool]:
    """Whether each experience enters the loss (overlong filtering leaves truncated ones out)."""
    return [not (overlong_filter and truncated(e.finish_reason)) for e in exps]


def episode_ids(exps: list[Experience]) -> list[str] | None:
    """Each experience's episode id, None when every one is a whole episode (ScoredBatch.episode_ids)."""
    return [e.episode_id for e in exps] if any(e.episode_id for e in exps) else None


def response_mask(exps: list[Experience], keep: list[bool]) -> torch.Tensor:
    """[N, T] 1.0 on the response tokens that train: the model's own (Experience.loss_mask), of the
    experiences that train."""
    width = max((len(e.response_token_ids) for e in exps), default=0)
    mask = torch.zeros(len(exps), max(width, 1))
    for i, (e, k) in enumerate(zip(exps, keep, strict=True)):
        if k:
            n = len(e.response_token_ids)
            mask[i, :n] = torch.tensor(e.loss_mask, dtype=mask.dtype) if e.loss_mask else 1.0
    return mask


def mask_rows(local: Local, keep: list[bool]) -> None:
    """Zero the loss mask of the rows that do not train."""
    for mbs, idx in local:
        for mb, rows in zip(mbs, idx, strict=True):
            for r, i in enumerate(rows):
                if not keep[i]:
                    mb["loss_mask"][r] = 0.0


def aligned(
    local: Local,
    seqs: list[Sequence],
    values: list[torch.Tensor],
    width: int,
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """[N, width] response-aligned rows of per-micro-batch [B, L] `values` (one per micro-batch, in
    `local`'s order), gathered from every data-parallel rank."""
    out = torch.zeros(len(seqs), width)
    it = iter(values)
    for mbs, idx in local:
        for _, rows in zip(mbs, idx, strict=True):
            v = next(it)
            for r, i in enumerate(rows):
                p, n = len(seqs[i].prompt_ids), len(seqs[i].response_ids)
                out[i, :n] = v[r, p : p + n].float()
    dist.all_reduce(out, group=group)  # each data-parallel rank filled its own rows
    return out


def place_advantages(local: Local, seqs: list[Sequence], adv: torch.Tensor, key: str = "advantages") -> None:
    """Write advantages ([N] per response, or [N, T] response-aligned per token) into the micro-
    batches' `key` field (created if missing: a critic's returns), on the tokens that train."""
    for mbs, idx in local:
        for mb, rows in zip(mbs, idx, strict=True):
            if key not in mb:
                mb[key] = torch.zeros_like(mb["loss_mask"])
            n_rows = len(rows)
            if adv.dim() == 1:
                mb[key][:n_rows] = mb["loss_mask"][:n_rows] * adv[rows].unsqueeze(1)
                continue
            for r, i in enumerate(rows):
                p, n = len(seqs[i].prompt_ids), len(seqs[i].response_ids)
                mb[key][r, p : p + n] = mb["loss_mask"][r, p : p + n] * adv[i, :n]


def shaped_scores(
    exps: list[Experience], algo: AlgorithmConfig, max_tokens: int, metrics: dict[str, float]
) -> torch.Tensor:
    """[N] each experience's reward with DAPO's soft overlong punishment (when configured)."""
    scores = torch.tensor([e.reward for e in exps], dtype=torch.float32)
    if algo.overlong_buffer_len > 0:
        penalty = torch.tensor(
            [
                overlong_penalty(e.model_tokens, max_tokens, algo.overlong_buffer_len, algo.overlong_penalty_factor)
                for e in exps
            ]
        )  # fmt: skip
        scores = scores + penalty
        metrics["rollout/overlong_penalty"] = float(penalty.mean())
    return scores


def token_kl(
    local: Local, seqs: list[Sequence], algo: AlgorithmConfig, width: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """[N, T] the KL estimate (algo.kl_penalty_fn) of each trained response token, old policy
    against the reference."""
    per_mb = [
        kl_estimate(mb["old_logprobs"], mb["ref_logprobs"], algo.kl_penalty_fn) * mb["loss_mask"]
        for mbs, _ in local
        for mb in mbs
    ]
    return aligned(local, seqs, per_mb, width, group)


def build_scored(
    exps: list[Experience], seqs: list[Sequence], local: Local, algo: AlgorithmConfig, kl_coef: float,
    group: dist.ProcessGroup | None, scores: torch.Tensor, keep: list[bool], with_ref: bool,
) -> tuple[ScoredBatch, torch.Tensor | None]:  # fmt: skip
    """The algorithm's view of the step, and the per-sequence KL (None without KL in the reward)."""
    mask = response_mask(exps, keep)
    width = mask.shape[1]
    batch = ScoredBatch(
        scores, [e.group_id for e in exps], response_mask=mask, cfg=algo, episode_ids=episode_ids(exps)
    )
    seq_kl = None
    if algo.use_kl_in_reward:
        kl = token_kl(local, seqs, algo, width, group)
        seq_kl = kl.sum(dim=1).double()
        batch.scores = scores
        batch.rewards = scores - kl_coef * seq_kl.float()
        batch.token_penalty = kl_coef * kl
    if with_ref:
        batch.ref_logprobs = aligned(
            local, seqs, [mb["ref_logprobs"] for mbs, _ in local for mb in mbs], width, group
        )
    return batch, seq_kl


class LocalRows:
    """A step's rows for the step passes' hooks (core/algorithms/step_pass.py StepRows)."""

    def __init__(self, local: Local, seqs: list[Sequence], group: dist.ProcessGroup | None):
        self.local, self.seqs, self.group = local, seqs, group

    def gather(self, per_micro_batch: list[torch.Tensor], width: int) -> torch.Tensor:
        return aligned(self.local, self.seqs, per_micro_batch, width, self.group)

    def place(self, values: torch.Tensor, key: str) -> None:
        place_advantages(self.local, self.seqs, values, key)

    def micro_batches(self) -> list[Batch]:
        return [mb for mbs, _ in self.local for mb in mbs]
