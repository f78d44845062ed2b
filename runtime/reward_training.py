"""A reward model's side of a stage's training (algorithm_type reward_model): the model is the
policy's trunk with a bias-free scalar head (the strategy's value head), and a sequence's score is
the head's output at its last token (core/algorithms/reward_model.py).

The strategies' value layout puts at position t the head's output at t - 1 (the value of the state
before token t), so a sequence's score sits one position past its end: each sequence is scored with
one token appended, whose position reads the head at the last real token. The token itself is never
read (attention is causal); the appended position is the only one in the loss mask.

    sequence_scores(t, specs)     each sequence's score (the trainer's ComputeLogprobs on such a stage)
    train_pairs(t, specs)         the Bradley-Terry gradients over (chosen, rejected) pairs
    sequence_classifier_config()  the HF config an export writes (AutoModelForSequenceClassification)

Every function is collective, as StageTraining's methods are.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Protocol

import torch

from ..core.algorithms.dpo import SequenceSurrogate
from ..core.algorithms.reward_model import bradley_terry_pairs
from ..core.batch import Batch, Sequence, gathered_by_index

SequenceSpec = Any
"""training.SequenceSpec (prompt, response, loss_mask, advantages, old_logprobs)."""


class StageTraining(Protocol):
    """What these functions use of training.StageTraining (which imports this module)."""

    pad_token_id: int
    strategy: Any

    def micro(self, mini: list[Sequence]) -> tuple[list[Batch], list[list[int]]]: ...

    def spec_batches(self, specs: list[SequenceSpec]) -> list[Batch]: ...


def scored_spec(spec: SequenceSpec, pad_token_id: int) -> SequenceSpec:
    """`spec` with the token whose position reads its score appended, alone in the loss mask."""
    n = len(spec.response)
    return dataclasses.replace(
        spec, response=[*spec.response, pad_token_id], loss_mask=[0.0] * n + [1.0],
        advantages=[*spec.advantages, 0.0], old_logprobs=None,
    )  # fmt: skip


def sequence_scores(t: StageTraining, specs: list[SequenceSpec]) -> list[float]:
    """Each sequence's score (every rank scores its data-parallel share; all get all, in order)."""
    ext = [scored_spec(s, t.pad_token_id) for s in specs]
    seqs = [Sequence(s.prompt, s.response, None, index=i) for i, s in enumerate(ext)]
    mbs, rows = t.micro(seqs)
    mine: dict[int, float] = {}
    for values, idx in zip(t.strategy.compute_values(mbs), rows, strict=True):
        for r, i in enumerate(idx):  # the appended token's position: p + n - 1 of its extended row
            mine[i] = float(values[r, len(ext[i].prompt) + len(ext[i].response) - 1])
    return gathered_by_index(mine, len(specs))


def train_pairs(t: StageTraining, specs: list[SequenceSpec], center_coef: float) -> dict[str, Any]:
    """The Bradley-Terry gradients over (chosen, rejected) pairs, pair k at 2k and 2k + 1; a chosen
    sequence's advantage (one value for all its tokens) is the pair's margin. A first pass scores
    every sequence, the surrogate's weights carry the loss's gradient (reward_model.py)."""
    assert len(specs) % 2 == 0, "bradley_terry takes (chosen, rejected) pairs"
    scores = torch.tensor(sequence_scores(t, specs), dtype=torch.float64)
    margins = torch.tensor([s.advantages[0] if s.advantages else 0.0 for s in specs[0::2]], dtype=torch.float64)
    pairs = bradley_terry_pairs(scores, margins, center_coef)
    weighted = [
        dataclasses.replace(e, advantages=[w] * len(e.response))
        for e, w in zip((scored_spec(s, t.pad_token_id) for s in specs), pairs.weights.tolist(), strict=True)
    ]
    metrics = t.strategy.forward_backward(
        t.spec_batches(weighted), SequenceSurrogate("reward_model/surrogate"), 1.0
    )
    metrics.update(pairs.metrics)
    return {"loss": pairs.loss, "metrics": metrics, "num_tokens": len(specs)}


def sequence_classifier_config(hf_config: Any, pad_token_id: int) -> Any:
    """The HF config a reward model's export writes: the critic's (one label) named as its family's
    ...ForSequenceClassification, which scores at the last token that is not `pad_token_id` (a
    batch of several rows needs it set)."""
    config = copy.deepcopy(hf_config)
    arch = (getattr(config, "architectures", None) or ["ForCausalLM"])[0]
    family = arch.split("For")[0] or type(config).__name__.removesuffix("Config")
    config.architectures = [f"{family}ForSequenceClassification"]
    config.num_labels = 1
    if config.pad_token_id is None:
        config.pad_token_id = pad_token_id
    return config
