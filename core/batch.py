"""Turn sequences into the tensor batches every strategy consumes.

Layout: right-padded [B, T]; position t of every per-token field refers to predicting
input_ids[:, t] from the tokens before it (so position 0 is never a target). Keys: input_ids,
attention_mask, loss_mask (1.0 on the response tokens that train), and, when given, old_logprobs,
advantages, the per-row [B] temperature (rows sampled at different temperatures), and the
routing records of rows that carry them (moe_routing.ROUTED_EXPERTS / ROUTED_VALID: routing replay).

The global train batch is split across data-parallel ranks (contiguously, or dealt so that token
counts balance), then each rank groups its share into micro-batches under a token budget (padded
size, or summed lengths when the strategy packs sequences: backends/common/packed.py). FSDP-style
backends run collectives in every forward, so all ranks must run the same number of micro-batches:
`equalize` pads the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .moe_routing import ROUTED_EXPERTS, ROUTED_VALID
from .types import routing_tokens

Batch = dict[str, torch.Tensor]


@dataclass
class Sequence:
    """One training sequence before padding."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float] | None = None
    advantage: float = 0.0
    index: int = -1
    """Position in the global train batch (to route per-sequence values back to rows)."""
    loss_mask: list[int] | None = None
    """Per response token, 1 to train it, 0 for context (a multi-turn conversation's environment
    turns); None trains every response token."""
    temperature: float | None = None
    """The temperature its response was sampled at, when a batch's rows differ in it (the batch's
    `temperature` field, logprob.TEMPERATURE); None: the one temperature the strategy is given."""
    routed_experts: bytes = b""
    """The experts the engine routed its tokens to (Experience.routed_experts; empty: none), replayed
    by the trainer's forward (the batch's moe_routing.ROUTED_EXPERTS / ROUTED_VALID)."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def trained_tokens(self) -> int:
        return len(self.response_ids) if self.loss_mask is None else sum(self.loss_mask)


def shard(items: list, rank: int, world_size: int) -> list:
    """Contiguous, near-equal split (the first `len % world` ranks get one more)."""
    base, extra = divmod(len(items), world_size)
    start = rank * base + min(rank, extra)
    return items[start : start + base + (1 if rank < extra else 0)]


def pack(seqs: list[Sequence], pad_token_id: int) -> Batch:
    """Right-pad `seqs` into one batch."""
    assert seqs, "pack() needs at least one sequence"
    width = max(s.length for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.float32)
    with_old = seqs[0].old_logprobs is not None
    old = torch.zeros((n, width), dtype=torch.float32)
    adv = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        attention_mask[i, : p + r] = 1
        if s.loss_mask is None:
            loss_mask[i, p : p + r] = 1.0
        else:
            assert len(s.loss_mask) == r, "one loss-mask value per response token"
            loss_mask[i, p : p + r] = torch.tensor(s.loss_mask, dtype=torch.float32)
        adv[i, p : p + r] = s.advantage
        if with_old:
            assert s.old_logprobs is not None and len(s.old_logprobs) == r
            old[i, p : p + r] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "advantages": adv,
    }
    if with_old:
        batch["old_logprobs"] = old
    routing = routing_records(seqs, width)
    if routing is not None:
        batch[ROUTED_EXPERTS], batch[ROUTED_VALID] = routing
    temps = [s.temperature for s in seqs]
    if any(t is not None for t in temps):
        assert None not in temps, "a batch gives every row its temperature, or none"
        batch["temperature"] = torch.tensor(temps, dtype=torch.float32)
    return batch


def routing_records(seqs: list[Sequence], width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows' routing records [B, width, layers * top_k] (uint8) and the positions they cover
    [B, width] (bool); None when no row has one."""
    sizes = {len(s.routed_experts) // routing_tokens(len(s.prompt_ids), len(s.response_ids))
             for s in seqs if s.routed_experts}  # fmt: skip
    if not sizes:
        return None
    assert len(sizes) == 1, f"routing records of different models in one batch: {sorted(sizes)} bytes per token"
    (per_token,) = sizes
    experts = torch.zeros((len(seqs), width, per_token), dtype=torch.uint8)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s.routed_experts:
            tokens = routing_tokens(len(s.prompt_ids), len(s.response_ids))
            assert len(s.routed_experts) == tokens * per_token, "a routing record of another length"
            experts[i, :tokens] = torch.frombuffer(bytearray(s.routed_experts), dtype=torch.uint8).view(tokens, -1)
            valid[i, :tokens] = True
    return experts, valid


def plan_micro_batches(
    seqs: list[Sequence], max_tokens: int, packed: bool = False, by_length: bool = False
) -> list[list[Sequence]]:
    """Group sequences into micro-batches under `max_tokens`: the sum of their lengths when
    `packed` (the model runs on the real tokens only), else rows x the longest (the padded size). A
    single sequence longer than the budget gets a micro-batch of its own.

    In order (by_length False): a micro-batch grows while the next sequence fits. `by_length`:
    padded groups are runs of the sequences sorted by length, cut where the padded total is least
    (`_least_padding`); packed ones are filled first-fit, longest first (the fewest micro-batches)."""
    if by_length:
        if packed:
            return _first_fit(sorted(seqs, key=lambda s: -s.length), max_tokens)
        return _least_padding(sorted(seqs, key=lambda s: s.length), max_tokens)
    groups: list[list[Sequence]] = []
    current: list[Sequence] = []
    size = longest = 0
    for s in seqs:
        longest_if_added = max(longest, s.length)
        size_if_added = size + s.length if packed else (len(current) + 1) * longest_if_added
        if current and size_if_added > max_tokens:
            groups.append(current)
            current, longest_if_added, size_if_added = [], s.length, s.length
        current.append(s)
        longest, size = longest_if_added, size_if_added
    if current:
        groups.append(current)
    return groups


def _least_padding(seqs: list[Sequence], max_tokens: int) -> list[list[Sequence]]:
    """Sequences sorted by length, cut into runs whose padded sizes (rows x the longest) stay under
    the budget: the fewest runs (forwards), and of those the least padded total; a dynamic programme
    over where the last run starts."""
    n = len(seqs)
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (runs, padded tokens) of seqs[:i]
    start = [0] * (n + 1)
    for i in range(1, n + 1):  # seqs[:i] grouped, the last run seqs[j:i] padded to seqs[i - 1]
        longest = seqs[i - 1].length
        rows = max(1, max_tokens // longest)  # a sequence over the budget runs alone
        j = min(range(max(0, i - rows), i), key=lambda j: (best[j][0], best[j][1] + (i - j) * longest))
        best[i] = (best[j][0] + 1, best[j][1] + (i - j) * longest)
        start[i] = j
    groups, i = [], n
    while i > 0:
        groups.append(seqs[start[i] : i])
        i = start[i]
    return groups[::-1]


def _first_fit(seqs: list[Sequence], max_tokens: int) -> list[list[Sequence]]:
    groups: list[list[Sequence]] = []
    sizes: list[int] = []
    for s in seqs:
        i = next((i for i, size in enumerate(sizes) if size + s.length <= max_tokens), None)
        if i is None:
            groups.append([s])
            sizes.append(s.length)
        else:
            groups[i].append(s)
            sizes[i] += s.length
    return groups


def deal(seqs: list[Sequence], world_size: int) -> list[list[Sequence]]:
    """Each data-parallel rank's share with balanced token counts: longest first, each sequence to
    the rank holding the fewest tokens so far (then the fewest sequences, then the lowest rank).
    Deterministic, so every rank computes the same deal."""
    shares: list[list[Sequence]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for s in sorted(seqs, key=lambda s: -s.length):
        r = min(range(world_size), key=lambda r: (loads[r], len(shares[r]), r))
        shares[r].append(s)
        loads[r] += s.length
    return shares


def equalize(groups: list[list[Sequence]], count: int) -> list[list[Sequence]]:
    """Split the largest groups until there are `count` of them; when no group can be split any
    more, add empty groups (the caller runs them as zero-loss dummies)."""
    groups = [g for g in groups if g]
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: len(groups[j]), default=None)
        if i is None or len(groups[i]) < 2:
            groups.append([])
            continue
        g = groups.pop(i)
        half = len(g) // 2
        groups[i:i] = [g[:half], g[half:]]
    return groups


def micro_batches(groups: list[list[Sequence]], pad_token_id: int, template: Sequence) -> list[Batch]:
    """Pack groups; an empty group becomes a one-row batch with an all-zero loss mask."""
    out = []
    for g in groups:
        if g:
            out.append(pack(g, pad_token_id))
        else:
            dummy = pack([template], pad_token_id)
            dummy["loss_mask"].zero_()
            dummy["advantages"].zero_()
            out.append(dummy)
    return out


def gathered_by_index(mine: dict[int, Any], count: int) -> list[Any]:
    """Each sequence's value, 0..count-1, from every rank's `mine` (sequence index -> value of the
    share it scored; ranks of one model replica hold the same share). Collective."""
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    merged = {i: v for part in parts for i, v in part.items()}
    return [merged[i] for i in range(count)]
