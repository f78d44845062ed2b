"""Per-token log-probs and entropy from vocabulary-parallel logits.

Each tensor-parallel rank holds logits for its slice of the (padded) vocabulary. Log-probs go
through megatron-core's vocab-parallel cross-entropy (one all-reduce of max and sum each, no rank
ever materialises the full vocabulary); entropy is computed the same way here. Columns past the
real vocabulary (padding so that it splits evenly) are excluded.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def _padding_mask(local_vocab: int, vocab: int, device: torch.device) -> torch.Tensor | None:
    """True for this rank's columns that are vocabulary padding; None when it has none."""
    start = parallel_state.get_tensor_model_parallel_rank() * local_vocab
    if start + local_vocab <= vocab:
        return None
    return torch.arange(start, start + local_vocab, device=device) >= vocab


def token_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, vocab: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [..., V_local] (already divided by the temperature), targets [...] -> log p(target)
    and (optionally) the entropy of the full distribution, both [...] in float32."""
    logits = logits.float()
    pad = _padding_mask(logits.shape[-1], vocab, logits.device)
    if pad is not None:
        logits = logits.masked_fill(pad, float("-inf"))
    entropy = _entropy(logits, pad) if with_entropy else None
    # megatron's kernel works in place on its input: give it its own copy when entropy needs ours
    ce_input = logits.clone() if with_entropy or pad is None else logits
    return -vocab_parallel_cross_entropy(ce_input, targets), entropy


def _entropy(logits: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """H = logsumexp(x) - sum_v p_v x_v over the whole vocabulary (autograd through the all-reduces:
    forward sums over ranks, backward passes the gradient through unchanged, as a sum needs)."""
    group = parallel_state.get_tensor_model_parallel_group()
    local_max = logits.detach().max(dim=-1).values
    torch.distributed.all_reduce(local_max, op=torch.distributed.ReduceOp.MAX, group=group)
    shifted = logits - local_max.unsqueeze(-1)
    exp = shifted.exp()
    sum_exp = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    finite = shifted if pad is None else shifted.masked_fill(pad, 0.0)  # p = 0 there; avoid 0 * -inf
    weighted = reduce_from_tensor_model_parallel_region((exp * finite).sum(dim=-1))
    return sum_exp.log() - weighted / sum_exp
