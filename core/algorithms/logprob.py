"""Per-token log-probabilities and entropies from logits.

Both are computed in float32 whatever the logits' dtype: bf16 log-softmax loses enough precision to
bias importance ratios. The vocabulary dimension is large (100k+), so the float32 work is done over
chunks of rows: the transient [rows, V] temporaries stay small and only autograd's saved input
(one float32 copy of bf16 logits, none for float32 logits) can reach full [B, T, V] size.
"""

from __future__ import annotations

import torch

TEMPERATURE = "temperature"
"""The micro-batch field [B] of each row's sampling temperature, present when a step's rows were
sampled at different ones (a mixture of tasksets); without it every row is scored at one."""


def at_temperature(
    logits_BTV: torch.Tensor, temperature: float, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Logits divided by the temperature their tokens were sampled at, so the trainer scores the
    distribution the engine sampled from: each row's batch[TEMPERATURE] when the micro-batch has it,
    else `temperature`. 0 (greedy) and 1 leave the logits as they are. A row is divided by a Python
    float, as one temperature divides them all: a row scores the same either way."""
    rows = batch.get(TEMPERATURE)
    if rows is None:
        return logits_BTV / temperature if temperature > 0 and temperature != 1.0 else logits_BTV
    return torch.stack(
        [row if t <= 0 or t == 1.0 else row / t for row, t in zip(logits_BTV, rows.tolist(), strict=True)]
    )


_CHUNK_ELEMENTS = 1 << 25
"""Logit elements converted to float32 at a time (32M: 128 MiB per temporary)."""


def _chunks(logits_BTV: torch.Tensor) -> list[torch.Tensor]:
    """Views of at most _CHUNK_ELEMENTS elements, in row-major order of (B, T): the whole tensor when
    it fits (one kernel call; decoding and small batches), else split per sequence rather than
    reshaping, which would copy logits that are a non-contiguous slice."""
    if logits_BTV.numel() <= _CHUNK_ELEMENTS:
        return [logits_BTV]
    rows = max(1, _CHUNK_ELEMENTS // logits_BTV.shape[-1])
    return [chunk for seq_TV in logits_BTV for chunk in seq_TV.split(rows)]


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[..., labels] as float32 [B, T], without a full log-softmax tensor.

    Uses log p(y) = logit_y - logsumexp(logits): only the gathered logit and the per-row logsumexp
    are kept, never the [B, T, V] log-softmax.
    """
    label_logits_BT = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    lse_BT = torch.cat([torch.logsumexp(c.float(), dim=-1) for c in _chunks(logits)]).view(labels.shape)
    return label_logits_BT - lse_BT


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position as float32 [B, T]: logsumexp - sum(softmax * logits).

    With autograd on, each chunk keeps its float32 logits and softmax for backward; call it under
    no_grad when the entropy is only a metric.
    """
    parts = []
    for chunk in _chunks(logits):
        x = chunk.float()
        parts.append(torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(-1))
    return torch.cat(parts).view(logits.shape[:-1])
