"""Structured output in the HF engine (SamplingParams.structured_output: a JSON schema, any JSON
object, or a regular expression), through xgrammar: each row's grammar matcher gives the tokens
that may come next as a bitmask, the sampler draws only from those, and the matcher takes the
token drawn. A row ends as any does (EOS or a stop token, which the grammar allows only once the
text is whole; or max_tokens, then the text is cut).

The log-prob a row reports is still the policy's own (log_softmax of the unmasked logits, under
temperature: what the trainer recomputes), as vLLM reports raw log-probs; the mask decides only
which token is drawn. JSON is compiled without free whitespace between tokens (`any_whitespace`
off, and "," and ":" as separators, as vLLM's disable_any_whitespace): a model that may write any
whitespace can write nothing else until max_tokens.

`xgrammar` comes with vLLM or on its own (`pip install 'rlcore[structured]'`); an engine imports it
only when a request asks for structured output.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from ...core.types import StructuredOutput
from .base import StructuredOutputRefused

COMPACT: dict[str, Any] = {"any_whitespace": False, "separators": (",", ":")}
"""JSON as vLLM compiles it with disable_any_whitespace (the vllm engine's setting): no whitespace."""


class Grammars:
    """One engine's grammar compiler (its tokenizer's vocabulary, its stop tokens); xgrammar keeps
    the grammars it compiled."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]):
        try:
            import xgrammar
        except ImportError:
            raise StructuredOutputRefused(
                "structured output needs the xgrammar package: pip install 'rlcore[structured]' (vLLM brings it too)"
            ) from None
        self.xgr, self.vocab_size = xgrammar, vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def compile(self, spec: StructuredOutput) -> Any:
        """`spec` compiled; StructuredOutputRefused naming what is wrong with it."""
        try:
            if spec.kind == "json_schema":
                return self.compiler.compile_json_schema(spec.spec, **COMPACT)
            if spec.kind == "json_object":
                return self.compiler.compile_json_schema(json.dumps({"type": "object"}), **COMPACT)
            return self.compiler.compile_regex(spec.spec)
        except Exception as e:  # xgrammar's own errors (RuntimeError, InvalidJSONError, ...)
            raise StructuredOutputRefused(f"structured output: the {spec.kind.replace('_', ' ')} cannot be compiled: {_reason(e)}") from None

    def rows(self, spec: StructuredOutput, prompts: list[list[int]], n: int) -> RowGrammars:
        """The grammar state of n rows per prompt; a resumed request's rows have taken the tokens
        its prompts end with (StructuredOutput.resumed)."""
        grammar = RowGrammars(self, self.compile(spec), len(prompts) * n)
        if spec.resumed:
            grammar.resume([p[len(p) - spec.resumed :] for p in prompts for _ in range(n)])
        return grammar


class RowGrammars:
    """The grammar state of one request's rows (row r: matcher r)."""

    def __init__(self, grammars: Grammars, compiled: Any, rows: int):
        self._xgr, self._vocab = grammars.xgr, grammars.vocab_size
        self.matchers = [grammars.xgr.GrammarMatcher(compiled) for _ in range(rows)]

    def masked(self, logits_AV: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """The logits of the `active` rows (their indices) with every token their grammars do not
        allow next at -inf."""
        rows = active.tolist()
        bitmask = self._xgr.allocate_token_bitmask(len(rows), self._vocab)  # every token allowed
        for k, row in enumerate(rows):
            if not self.matchers[row].is_terminated():  # a whole text (ignore_eos is refused) adds nothing
                self.matchers[row].fill_next_token_bitmask(bitmask, k)
        scores = logits_AV.float().clone()
        self._xgr.apply_token_bitmask_inplace(scores, bitmask.to(scores.device), vocab_size=self._vocab)
        return scores

    def accept(self, active: torch.Tensor, token_A: torch.Tensor) -> None:
        """The `active` rows drew `token_A`; their matchers move on."""
        for row, token in zip(active.tolist(), token_A.tolist(), strict=True):
            if not self.matchers[row].is_terminated() and not self.matchers[row].accept_token(token):
                raise StructuredOutputRefused(
                    "structured output: no token of the model's vocabulary continues the text as its grammar asks "
                    "(can the tokenizer write every character the schema or pattern needs?)"
                )

    def resume(self, responses: list[list[int]]) -> None:
        """Each row's matcher takes its response so far (row r: `responses[r]`)."""
        for matcher, tokens in zip(self.matchers, responses, strict=True):
            for token in tokens:
                if matcher.is_terminated() or not matcher.accept_token(token):
                    raise StructuredOutputRefused(
                        "structured output: a continued response's tokens so far do not follow its grammar"
                    )


def _reason(e: Exception) -> str:
    """xgrammar's message without its C++ source position ("[12:00:00] /project/cpp/x.cc:42: ...",
    "Check failed: (...) is false: ...") and the input it repeats."""
    text = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
    text = re.sub(r"^Check failed: .*? is false: ", "", text)
    return text.split(" The JSON string is:")[0]
