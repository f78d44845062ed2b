"""The HF engine's sampler, per decode step: the rules that depend on what a row holds (min_tokens,
logit_bias, repetition, presence and frequency penalties: `LogitRules`), then the filters
transformers' generate applies (temperature, top-k, top-p, min-p, in its order), inverse-CDF draws from
per-row uniforms, and the sampled token's log-prob under temperature only (the distribution the
trainer recomputes).

Every function works on whole [rows, vocab] tensors without a host sync, so the static decode loop
(hf_decode.decode_static) runs them on the device step after step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.stopping_criteria import StopStringCriteria

from ...core.algorithms.logprob import token_logprobs
from ...core.types import SamplingParams


@dataclass
class LogitRules:
    """What a sampling's per-row rules need besides the logits, kept on the device and updated
    after each step (`observe`). Applied in vLLM's order: min_tokens holds the stop tokens back,
    logit_bias is added, then the repetition penalty (over prompt and response, transformers' rule)
    and the presence and frequency penalties (over the response, OpenAI's rule)."""

    sampling: SamplingParams
    seen_RV: torch.Tensor | None
    """Tokens each row's prompt and response hold (the repetition penalty)."""
    counts_RV: torch.Tensor | None
    """How often each row's response holds each token (presence and frequency penalties)."""
    bias_V: torch.Tensor | None
    held_back: torch.Tensor | None
    """Token ids that cannot be sampled before min_tokens (EOS, ignored or not, and stop_token_ids)."""

    @classmethod
    def start(
        cls, sampling: SamplingParams, prompt_seen_RV: torch.Tensor | None, rows: int, vocab: int,
        device: torch.device, stop_ids: list[int],
    ) -> LogitRules | None:  # fmt: skip
        """The rules of `sampling` for `rows` rows (None when it has none); `prompt_seen_RV`, the
        tokens of each row's prompt, is needed only with a repetition penalty."""
        s = sampling
        seen = prompt_seen_RV if s.repetition_penalty != 1.0 else None
        counts = None
        if s.presence_penalty or s.frequency_penalty:
            counts = torch.zeros((rows, vocab), dtype=torch.float32, device=device)
        bias = None
        if s.logit_bias:
            bias = torch.zeros(vocab, dtype=torch.float32, device=device)
            bias[torch.tensor(list(s.logit_bias), device=device)] = torch.tensor(
                list(s.logit_bias.values()), dtype=torch.float32, device=device
            )
        held = torch.tensor(stop_ids, dtype=torch.long, device=device) if s.min_tokens and stop_ids else None
        if seen is None and counts is None and bias is None and held is None:
            return None
        return cls(s, seen, counts, bias, held)

    def apply(self, scores_RV: torch.Tensor, step: int) -> torch.Tensor:
        """`scores_RV` (float) under the rules at decode step `step` (the response's length)."""
        s = self.sampling
        if self.held_back is not None and step < s.min_tokens:
            scores_RV = scores_RV.index_fill(1, self.held_back, float("-inf"))
        if self.bias_V is not None:
            scores_RV = scores_RV + self.bias_V
        if self.seen_RV is not None:
            penalised = torch.where(
                scores_RV < 0, scores_RV * s.repetition_penalty, scores_RV / s.repetition_penalty
            )
            scores_RV = torch.where(self.seen_RV, penalised, scores_RV)
        if self.counts_RV is not None:
            scores_RV = (
                scores_RV
                - s.frequency_penalty * self.counts_RV
                - s.presence_penalty * (self.counts_RV > 0).float()
            )
        return scores_RV

    def observe(self, token_R: torch.Tensor) -> None:
        """Each row sampled `token_R`."""
        if self.seen_RV is not None:
            self.seen_RV.scatter_(1, token_R[:, None], True)
        if self.counts_RV is not None:
            self.counts_RV.scatter_add_(
                1, token_R[:, None], torch.ones_like(token_R[:, None], dtype=torch.float32)
            )

    def keep(self, keep_R: torch.Tensor) -> None:
        """Only the rows `keep_R` decode on (the others finished)."""
        if self.seen_RV is not None:
            self.seen_RV = self.seen_RV[keep_R]
        if self.counts_RV is not None:
            self.counts_RV = self.counts_RV[keep_R]


def filter_logits(
    logits_RV: torch.Tensor, sampling: SamplingParams, rules: LogitRules | None, step: int = 0
) -> torch.Tensor:
    """The logits the sampler draws from: the rules of what each row holds (`LogitRules`, at decode
    step `step`), then temperature, top-k, top-p, min-p (in transformers' order); filtered tokens
    get -inf."""
    scores = logits_RV.float()
    if rules is not None:
        scores = rules.apply(scores, step)
    if sampling.temperature == 0:
        return scores  # greedy: only the rules change which token is the largest
    scores = scores / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass
        drop_sorted = (probs.cumsum(dim=-1) - probs) > sampling.top_p
        drop_sorted[:, 0] = False
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    if sampling.min_p > 0:
        probs = scores.softmax(dim=-1)
        floor = sampling.min_p * probs.max(dim=-1, keepdim=True).values
        scores = scores.masked_fill(probs < floor, float("-inf"))
    return scores


def pick_tokens(scores_RV: torch.Tensor, greedy: bool, uniform_R: torch.Tensor | None) -> torch.Tensor:
    """The largest score (greedy), or the token whose slice of the cumulative distribution holds
    each row's uniform draw (inverse-CDF sampling: filtered tokens hold an empty slice)."""
    if greedy or uniform_R is None:
        return scores_RV.argmax(dim=-1)
    cdf_RV = scores_RV.softmax(dim=-1).double().cumsum(dim=-1)
    picked = torch.searchsorted(cdf_RV, (uniform_R * cdf_RV[:, -1])[:, None].contiguous(), right=True)
    return picked.squeeze(-1).clamp(max=scores_RV.shape[-1] - 1)


def uniform_draws(rows: int, steps: int, row_seeds: list[int] | None) -> torch.Tensor:
    """[rows, steps] uniforms for the sampler: from each row's own generator when seeded (a row's
    tokens then depend on its prompt and seed only, not on the rows beside it), else from torch's
    global RNG."""
    if row_seeds is None:
        return torch.rand(rows, steps, dtype=torch.float64)
    return torch.stack(
        [
            torch.rand(steps, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
            for s in row_seeds
        ]
    )


def sampled_logprobs(logits_RV: torch.Tensor, tokens_R: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at each row's token (T = 0: the raw logits), computed by the function
    the trainer scores responses with."""
    if temperature > 0:
        logits_RV = logits_RV.float() / temperature
    return token_logprobs(logits_RV[:, None], tokens_R[:, None])[:, 0]


class TextStopStrings(StopStringCriteria):
    """transformers' stop-string matcher (on the device, no decoding per step) over the text a reply
    decodes to: special tokens, which decoding drops (`<|im_end|>`, `<tool_call>` where special),
    take no part in a match, so a stop string like "<|im" never matches inside one. vLLM matches
    stop strings on the decoded text the same way."""

    def clean_and_embed_tokens_with_cache(self, token_list: Any, token_indices: Any, tokenizer: Any) -> Any:
        self._special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self._special |= set(tokenizer.all_special_ids)
        # transformers caches the matching tables by vocabulary: this one's differ
        return super().clean_and_embed_tokens_with_cache(
            (*token_list, "<rlcore: no special tokens>"), token_indices, tokenizer
        )

    def clean_tokenizer_vocab(  # type: ignore[override]
        self, tokenizer: Any, static_prefix: str = "abcdef", stop_string_matching_mode: Any = None
    ) -> tuple[tuple[Any, ...], tuple[int, ...]]:
        tokens, indices = StopStringCriteria.clean_tokenizer_vocab(
            tokenizer, static_prefix, stop_string_matching_mode
        )
        keep = [k for k, i in enumerate(indices) if i not in self._special]
        return tuple(tokens[k] for k in keep), tuple(indices[k] for k in keep)
