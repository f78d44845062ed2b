"""A running batch's rows in the static decode state (hf_static.py): continuous batching on a GPU,
each decode step a CUDA graph replay.

The running batch (hf_running.RunningBatch) samples, ends rows and admits requests as it does over
transformers' dynamic cache; only where the rows' keys and values live differs (`StaticRows`):

- a row holds one slot (a batch row of the state) from the step it joins to the step it ends. A
  joining request's prefill (its prompts left-padded to one width W) is copied into free slots'
  columns 0..W-1, and each of its rows writes its decoded tokens from column W on: rows of
  different requests write different columns at the same step (the cache's per-row slot);
- a row that ends frees its slot, which stays in the step (it reads and writes its column 0
  alone) until a joining row takes it;
- the state is the smallest batch bucket that holds the rows, at least MIN_ROWS (a decode step of
  a few rows costs what one row's does: the weights' reads), its capacity the longest any row
  needs (prompt width + max_tokens, rounded up to a power of two times 128 tokens). So a few
  states serve many requests, and their captured graphs are reused rather than captured again (the
  engine keeps hf_static.MAX_STATES states). A request that does not fit moves the rows to a larger
  state; once the rows fill a quarter of the state or less they move to a smaller one (the quarter
  keeps a batch hovering at a bucket's edge from moving every step). Moving copies each row's
  columns.

A step feeds each row's token to its slot, replays the graph of the view length the longest row
has reached (hf_static.StaticDecodeState.step), and gathers the rows' logits (and routing records)
back in the batch's order.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .hf_static import CAPACITY_STEP, StaticDecodeState, StaticDecodeStates, batch_bucket, round_up

SHRINK_AT = 4
"""The rows move to a smaller state once they fill 1/SHRINK_AT of theirs or less."""
MIN_ROWS = 8
"""The smallest batch a running batch's state holds (at most the engine's max_batch_size)."""


def capacity_for(length: int, max_model_len: int) -> int:
    """The capacity a running batch asks for rows of up to `length` tokens: the next power of two
    times CAPACITY_STEP, at most max_model_len, or `length` rounded up to CAPACITY_STEP where the
    rows need more (a short prompt padded to a long one's width beside it, with a large max_tokens)."""
    steps = -(-length // CAPACITY_STEP)
    return min(CAPACITY_STEP << (steps - 1).bit_length(), max(round_up(length), max_model_len))


class StaticRows:
    """The rows of a running batch (hf_running.BatchRows) in slots of `states`' static decode
    states; `record`: each step also returns the experts it routed every row's token to."""

    def __init__(self, states: StaticDecodeStates, record: bool = False):
        self.states, self.record = states, record
        self.state: StaticDecodeState | None = None
        self.slots: list[int] = []
        """Each running row's slot, in the batch's order."""
        self.needs: list[int] = []
        """Each running row's capacity: its prompt width + max_tokens."""
        self.columns: list[int] = []
        """The column each running row writes at the next step."""
        self.logits_AV = torch.empty(0)
        self._slots_A = torch.empty(0, dtype=torch.long)

    def join(
        self, cache: DynamicCache, mask_AL: torch.Tensor, positions_A: torch.Tensor, logits_AV: torch.Tensor,
        budgets: list[int],
    ) -> None:  # fmt: skip
        width = mask_AL.shape[1]
        needs = self.needs + [width + b for b in budgets]
        state = self._fit(len(needs), max(needs))
        taken = set(self.slots)
        free = [s for s in range(state.batch) if s not in taken][: len(budgets)]
        state.load_rows(cache, torch.tensor(free, device=mask_AL.device), mask_AL, positions_A)
        self.logits_AV = torch.cat([self.logits_AV, logits_AV]) if self.slots else logits_AV
        self.slots, self.needs = self.slots + free, needs
        self.columns += [width] * len(budgets)
        self._slots_A = torch.tensor(self.slots, device=mask_AL.device)
        self.states.held = state

    def keep(self, keep_A: torch.Tensor) -> None:
        assert self.state is not None
        kept = keep_A.tolist()
        gone = [s for s, k in zip(self.slots, kept, strict=True) if not k]
        self.slots, self.needs, self.columns = (
            [x for x, k in zip(xs, kept, strict=True) if k] for xs in (self.slots, self.needs, self.columns)
        )
        self._slots_A = torch.tensor(self.slots, dtype=torch.long, device=keep_A.device)
        if gone:
            self.state.free_rows(torch.tensor(gone, device=keep_A.device))
        if self.slots:
            self.states.held = self._fit(len(self.slots), max(self.needs))
        else:
            self.states.held = None

    def feed(self, token_A: torch.Tensor) -> torch.Tensor | None:
        state = self.state
        assert state is not None and self.slots
        token_B = torch.zeros(state.batch, dtype=torch.long, device=token_A.device)
        token_B[self._slots_A] = token_A
        logits_BV = state.step(token_B, max(self.columns), record=self.record)
        self.columns = [c + 1 for c in self.columns]
        self.logits_AV = logits_BV[self._slots_A]  # a copy: the graph's output is overwritten next step
        if not self.record:
            return None
        assert state.routes_BLK is not None
        return state.routes_BLK[self._slots_A]

    def _fit(self, rows: int, length: int) -> StaticDecodeState:
        """The state for `rows` rows of up to `length` tokens: the one in use while it holds them
        and is less than SHRINK_AT times too large, else another, the running rows moved into its
        first slots."""
        old = self.state
        most = self.states.max_batch_size
        bucket = max(batch_bucket(rows, most), min(MIN_ROWS, most))
        if old is not None and old.capacity >= length and bucket <= old.batch < bucket * SHRINK_AT:
            return old
        new = self.states.get(bucket, capacity_for(length, self.states.max_model_len))
        if new is old:
            return old
        device = new.live_B.device
        new.free_rows(torch.arange(new.batch, device=device))  # a state used before: every slot free
        if old is not None and self.slots:
            moved = list(range(len(self.slots)))
            new.take_rows(old, self._slots_A, torch.tensor(moved, device=device))
            self.slots, self._slots_A = moved, torch.tensor(moved, device=device)
        self.state = new
        return new
