"""Sequence packing: run a model on a micro-batch's real tokens laid end to end, no padding.

The loop's micro-batches stay right-padded [B, T] (core/batch.py): every loss, metric and per-row
reduction reads that layout. Only the model runs packed: `Packed.of(batch)` lays the rows' real
tokens out as one row [1, N] (N = the sum of the lengths) with position ids restarting at 0 for
each sequence, the model attends within each sequence only (HF: attention.py's packed attention,
one causal attention per sequence; megatron: THD with cu_seqlens, megatron/packing.py), and
`to_rows` scatters its per-token outputs back to [B, T], zeros at padding. With a long tail of
lengths most of a padded forward's tokens are padding; packed, the forward costs what the real
tokens cost.

Position j of the packed row predicts token j from the logits at j - 1; at the first token of each
sequence that would read the previous sequence's last logits, so those positions are 0, as
position 0 of a padded row is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.algorithms.logprob import TEMPERATURE


@dataclass
class Packed:
    """Where the real tokens of a right-padded [B, T] micro-batch sit in its packed row."""

    real: torch.Tensor
    """[B, T] bool: the real (not padding) positions, in row-major order the packed order."""
    lengths: torch.Tensor
    """[B] each row's real length."""
    input_ids: torch.Tensor
    """[1, N] the real tokens, row after row."""
    position_ids: torch.Tensor
    """[1, N] each token's position inside its own sequence."""
    cu_seqlens: torch.Tensor
    """[B + 1] int32 offsets of the sequences in the packed row (flash-attention's and THD's form)."""

    @classmethod
    def of(cls, batch: dict[str, torch.Tensor]) -> Packed:
        real = batch["attention_mask"].bool()
        lengths = real.sum(-1)
        starts = torch.cumsum(lengths, 0) - lengths
        n = int(lengths.sum())
        idx = torch.arange(n, device=real.device)
        # each token's position: its index minus the start of its sequence
        position_ids = idx - starts.repeat_interleave(lengths)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=real.device)
        cu[1:] = torch.cumsum(lengths, 0)
        return cls(real, lengths, batch["input_ids"][real][None], position_ids[None], cu)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def max_seqlen(self) -> int:
        return int(self.lengths.max())

    def starts(self) -> torch.Tensor:
        """[N] bool: the first token of each sequence."""
        first = torch.zeros(self.num_tokens, dtype=torch.bool, device=self.real.device)
        first[self.cu_seqlens[:-1][self.lengths > 0].long()] = True
        return first

    def shifted(self, values_N: torch.Tensor) -> torch.Tensor:
        """[N] from per-position outputs [N] of the predictions they make: position j gets
        values_N[j - 1], the first token of each sequence 0."""
        out = torch.cat([values_N.new_zeros(1), values_N[:-1]])
        return out.masked_fill(self.starts(), 0.0)

    def from_predictions(self, preds: torch.Tensor) -> torch.Tensor:
        """[B, T] in the trainer's layout from [N - 1] values computed at positions 0..N-2 about the
        token after each (log-probs of the next token, the entropy of its distribution): each moves
        to the position of the token it is about, 0 at sequence starts and at padding."""
        return self.to_rows(self.shifted(torch.cat([preds, preds.new_zeros(1)])))

    def to_rows(self, values_N: torch.Tensor) -> torch.Tensor:
        """[B, T] with `values_N` [N] at the real positions, 0 at padding (differentiable)."""
        out = values_N.new_zeros(self.real.shape)
        return out.masked_scatter(self.real, values_N)

    def padded(self, multiple: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(input ids [1, M], position ids [1, M], sequence offsets) with M the token count rounded
        up to `multiple`: the extra tokens are a sequence of their own at the end (the tail)."""
        tail = -self.num_tokens % multiple
        ids, positions = self.input_ids, self.position_ids
        cu = self.cu_seqlens.tolist()
        if tail:
            ids = torch.cat([ids, ids.new_zeros(1, tail)], dim=1)
            positions = torch.cat([positions, torch.arange(tail, device=positions.device)[None]], dim=1)
            cu.append(self.num_tokens + tail)
        return ids, positions, cu

    def temperatures(self, batch: dict[str, torch.Tensor], temperature: float, width: int) -> torch.Tensor | None:
        """[width] what each position's logits are divided by (1 where they stay: temperature 0 or 1,
        and past the real tokens); None when nothing is divided."""
        spans = self.row_temperature(batch) or [(0, self.num_tokens, temperature)]
        if all(t <= 0 or t == 1.0 for _, _, t in spans):
            return None
        out = torch.ones(width, device=self.input_ids.device)
        for a, b, t in spans:
            if t > 0 and t != 1.0:
                out[a:b] = t
        return out

    def row_temperature(self, batch: dict[str, torch.Tensor]) -> list[tuple[int, int, float]] | None:
        """(start, end, temperature) of each sequence with a row temperature of its own
        (batch[TEMPERATURE]); None when the batch has one temperature."""
        rows = batch.get(TEMPERATURE)
        if rows is None:
            return None
        cu = self.cu_seqlens.tolist()
        return [(cu[i], cu[i + 1], t) for i, t in enumerate(rows.tolist())]


def at_temperature_packed(
    logits_NV: torch.Tensor, temperature: float, packed: Packed, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Packed logits [N, V] divided by the temperature each sequence was sampled at (as
    logprob.at_temperature does row by row): 0 (greedy) and 1 leave them as they are."""
    spans = packed.row_temperature(batch)
    if spans is None:
        return logits_NV / temperature if temperature > 0 and temperature != 1.0 else logits_NV
    return torch.cat([
        logits_NV[a:b] if t <= 0 or t == 1.0 else logits_NV[a:b] / t for a, b, t in spans
    ])  # fmt: skip
