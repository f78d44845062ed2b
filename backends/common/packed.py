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

    def from_predictions(self, preds: torch.Tensor) -> torch.Tensor:
        """[B, T] in the trainer's layout from [N - 1] values computed at positions 0..N-2 about the
        token after each (log-probs of the next token, the entropy of its distribution, a critic's
        value of the state): each moves to the position of the token it is about, 0 at sequence
        starts (whose predecessor is another sequence's last token) and at padding."""
        shifted = torch.cat([preds.new_zeros(1), preds]).masked_fill(self.starts(), 0.0)
        return self.to_rows(shifted)

    def to_rows(self, values_N: torch.Tensor) -> torch.Tensor:
        """[B, T] with `values_N` [N] at the real positions, 0 at padding (differentiable)."""
        out = values_N.new_zeros(self.real.shape)
        return out.masked_scatter(self.real, values_N)

    def padded(self, width: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(input ids [1, width], position ids [1, width], sequence offsets) of the row made `width`
        long (>= its tokens) with a padding tail that is a sequence of its own at the end, attending
        only to itself (the shape a Ulysses group needs; its outputs are dropped)."""
        tail = width - self.num_tokens
        assert tail >= 0, (width, self.num_tokens)
        ids, positions = self.input_ids, self.position_ids
        cu = self.cu_seqlens.tolist()
        if tail:
            ids = torch.cat([ids, ids.new_zeros(1, tail)], dim=1)
            positions = torch.cat([positions, torch.arange(tail, device=positions.device)[None]], dim=1)
            cu.append(self.num_tokens + tail)
        return ids, positions, cu

    def row_temperature(self, batch: dict[str, torch.Tensor]) -> list[tuple[int, int, float]] | None:
        """(start, end, temperature) of each sequence with a row temperature of its own
        (batch[TEMPERATURE]); None when the batch has one temperature."""
        rows = batch.get(TEMPERATURE)
        if rows is None:
            return None
        cu = self.cu_seqlens.tolist()
        return [(cu[i], cu[i + 1], t) for i, t in enumerate(rows.tolist())]


def at_temperatures(logits: torch.Tensor, pieces: list[tuple[int, float]]) -> torch.Tensor:
    """Logits [n, V] cut into consecutive pieces (length, temperature), the lengths summing to n,
    each divided by its temperature by a Python float (as logprob.at_temperature divides a row):
    0 (greedy) and 1 leave a piece as it is."""
    out, a = [], 0
    for n, t in pieces:
        piece = logits[a : a + n]
        out.append(piece if t <= 0 or t == 1.0 else piece / t)
        a += n
    assert a == logits.shape[0], (a, logits.shape)
    if len(out) <= 1:
        return out[0] if out else logits
    return torch.cat(out)


def at_temperature_packed(
    logits: torch.Tensor, temperature: float, packed: Packed, batch: dict[str, torch.Tensor], start: int = 0
) -> torch.Tensor:
    """Logits [n, V] of the packed row's positions start..start+n-1 divided by the temperature each
    sequence was sampled at (`at_temperatures`): positions past the real tokens (a tail) stay as
    they are."""
    spans = packed.row_temperature(batch)
    if spans is None:
        return at_temperatures(logits, [(logits.shape[0], temperature)])
    end = start + logits.shape[0]
    pieces = []
    for a, b, t in [*spans, (packed.num_tokens, max(end, packed.num_tokens), 1.0)]:
        a, b = max(a, start), min(b, end)
        if b > a:
            pieces.append((b - a, t))
    return at_temperatures(logits, pieces)
