"""From scored experiences to advantages in the trainer's rows: the rewards an algorithm sees
(the length term, DAPO's overlong shaping, the KL penalty in the reward), its ScoredBatch, and the advantages
written back into each row. `AlgorithmStep` is that half of a step, one for every trainer.

rlcore's trainer's micro-batches hold whole rows ([B, L]: prompt then response, right-padded;
LocalRows), a Tinker client's one micro-batch of response-aligned rows (WholeRows); a ScoredBatch
holds response-aligned [N, T] tensors. Every rank knows every experience, but each data-parallel rank
computed log-probs for its own rows only: `aligned` sums their parts over the data-parallel group.
"""

from __future__ import annotations

from collections.abc import Sequence as Listing

import torch
import torch.distributed as dist

from ..core.algorithms.dapo import overlong_penalty, truncated
from ..core.algorithms.episodes import per_episode
from ..core.algorithms.kl import kl_estimate
from ..core.algorithms.length import length_rewards
from ..core.algorithms.scored import ScoredBatch
from ..core.algorithms.step_pass import StepPass, StepRows
from ..core.batch import Batch, Sequence
from ..core.config.schema import AlgorithmConfig, LengthPenaltyConfig
from ..core.types import Experience, episode_key

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
    """[N] each experience's reward with the length term (algorithm.length_penalty) and DAPO's soft
    overlong punishment, when configured."""
    scores = torch.tensor([e.reward for e in exps], dtype=torch.float32)
    if algo.length_penalty.kind != "none":
        terms = torch.tensor(length_terms(exps, algo.length_penalty), dtype=torch.float32)
        scores = scores + terms
        metrics["rollout/length_penalty"] = float(terms.mean())
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


def length_terms(exps: list[Experience], lp: LengthPenaltyConfig) -> list[float]:
    """Each experience's length term (core/algorithms/length.py): an episode's samples share theirs,
    taken over the episode's model tokens and reward, as they share the episode's reward."""
    units: dict[tuple[str, str] | int, list[int]] = {}
    for i, e in enumerate(exps):
        units.setdefault(episode_key(e.group_id, e.episode_id, i), []).append(i)
    firsts = [exps[rows[0]] for rows in units.values()]
    lengths = [sum(exps[i].model_tokens for i in rows) for rows in units.values()]
    per_unit = length_rewards(
        lengths, [e.reward for e in firsts], [e.group_id for e in firsts], lp.kind, lp.coef, lp.correct_reward
    )
    out = [0.0] * len(exps)
    for rows, term in zip(units.values(), per_unit, strict=True):
        for i in rows:
            out[i] = term
    return out


class AlgorithmStep:
    """The algorithm's half of a step, the same for every trainer (rlcore's own, training.py; a
    Tinker service, tinker/trainer.py): which experiences train, the rewards the algorithm sees
    (the length term, DAPO's overlong shaping, the KL penalty in the reward), its ScoredBatch and its advantages,
    with the step passes' hooks around them. The trainer runs its log-prob passes between
    `trained` and `advantages` and lends the step's rows (StepRows: its micro-batches, gathered over
    its data-parallel ranks, or WholeRows on one client); the advantages land in their
    "advantages" field."""

    def __init__(self, algo: AlgorithmConfig, max_response_len: int, passes: Listing[StepPass] = ()):
        """`algo`: the stage's algorithm config, preset filled (with_preset)."""
        from ..core.algorithms import advantage_fn_of, reference_in_advantage
        from ..core.algorithms.kl import build_kl_controller

        self.algo, self.max_response_len, self.passes = algo, max_response_len, list(passes)
        self.advantage_fn = None if algo.advantage_fn is None else advantage_fn_of(algo.advantage_fn)
        self.ref_in_advantage = reference_in_advantage(algo)
        self.kl_ctrl = build_kl_controller(algo.kl_ctrl)

    def trained(self, exps: list[Experience]) -> list[bool]:
        """Whether each experience enters the loss (overlong filtering leaves truncated ones out)."""
        return trained(exps, bool(self.algo.overlong_filter))

    def advantages(
        self, exps: list[Experience], keep: list[bool], rows: StepRows, metrics: dict[str, float]
    ) -> ScoredBatch:
        """The algorithm's view of the step and its advantages, placed in `rows`' "advantages" (the
        rows' micro-batches hold "old_logprobs", and "ref_logprobs" when the step reads the
        reference)."""
        algo = self.algo
        scores = shaped_scores(exps, algo, self.max_response_len, metrics)
        mask = response_mask(exps, keep)
        width = mask.shape[1]
        batch = ScoredBatch(
            scores, [e.group_id for e in exps], response_mask=mask, cfg=algo, episode_ids=episode_ids(exps)
        )
        mbs = rows.micro_batches()
        if algo.use_kl_in_reward:
            kl_fn = algo.kl_penalty_fn
            kl = rows.gather(
                [kl_estimate(mb["old_logprobs"], mb["ref_logprobs"], kl_fn) * mb["loss_mask"] for mb in mbs], width
            )
            seq_kl = kl.sum(dim=1).double()
            coef = self.kl_ctrl.value
            batch.scores = scores
            batch.rewards = scores - coef * seq_kl.float()
            batch.token_penalty = coef * kl
            metrics["rollout/kl_penalty"] = float(seq_kl.mean())
            metrics["rollout/kl_coef"] = coef
            self.kl_ctrl.update(float(seq_kl.mean()), len(exps))
        if self.ref_in_advantage:
            batch.ref_logprobs = rows.gather([mb["ref_logprobs"] for mb in mbs], width)
        if algo.overlong_filter:
            metrics["rollout/overlong_filtered"] = 1.0 - sum(keep) / len(keep)
        for p in self.passes:
            p.before_advantages(batch, rows)
        assert self.advantage_fn is not None, "an RL algorithm has an advantage function"
        rows.place(per_episode(self.advantage_fn, batch), "advantages")
        for p in self.passes:
            p.after_advantages(batch, rows, metrics)
        return batch


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


class WholeRows:
    """A step's rows held whole by one process (a Tinker client): one "micro-batch" of [N, T]
    response-aligned tensors, "loss_mask" (response_mask) and "old_logprobs" (the engine's, or
    recomputed), to which `place` adds fields."""

    def __init__(self, mask: torch.Tensor, old_logprobs: list[list[float]]):
        old = torch.zeros_like(mask)
        for i, lps in enumerate(old_logprobs):
            n = min(len(lps), mask.shape[1])
            old[i, :n] = torch.tensor(lps[:n], dtype=old.dtype)
        self.batch: Batch = {"loss_mask": mask, "old_logprobs": old}

    def gather(self, per_micro_batch: list[torch.Tensor], width: int) -> torch.Tensor:
        (values,) = per_micro_batch
        return values[:, :width].float()

    def place(self, values: torch.Tensor, key: str) -> None:
        mask = self.batch["loss_mask"]
        self.batch[key] = mask * (values.unsqueeze(1) if values.dim() == 1 else values[:, : mask.shape[1]])

    def micro_batches(self) -> list[Batch]:
        return [self.batch]
