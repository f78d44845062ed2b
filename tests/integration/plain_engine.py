"""An inference engine written outside rlcore, in one file: what adding an engine takes.

`explorer.rollout_model.engine_type: tests.integration.plain_engine:PlainEngine` selects it (or
`rlcore rollout serve --engine` the same path); its constructor's keyword parameters beyond the
common four are its options, set in `explorer.rollout_model.engine_options`. It decodes with a
plain transformers model, one full forward per token (no KV cache), and takes new weights by copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlcore.core.types import Completion, SamplingParams
from rlcore.rollout.engines.base import (
    RolloutEngine,
    check_prompts,
    ending_tokens,
    prompt_seed,
    resolve_max_model_len,
    response_text,
    stop_token_ids,
)


class PlainEngine(RolloutEngine):
    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int | None = None,
        max_batch_size: int = 256,
        seed: int = 0,
        response_cap: int = 0,
    ):
        """`response_cap`: the most tokens a response gets whatever a request asks (0: max_tokens)."""
        if dtype != "float32":
            raise ValueError(f"the plain engine decodes in float32 only; got dtype {dtype}")
        if response_cap < 0:
            raise ValueError(f"response_cap must be >= 0; got {response_cap}")
        self.device = torch.device(device)
        self.max_model_len = resolve_max_model_len(model_path, max_model_len)
        self.max_batch_size = max_batch_size
        self.seed, self.response_cap = seed, response_cap
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device).eval()
        self.eos_token_ids = stop_token_ids(self.model.generation_config.eos_token_id, self.tokenizer, model_path)
        self._weights = self.model.state_dict()

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        check_prompts(prompt_token_ids, sampling.max_tokens, self.max_model_len)
        budget = min(sampling.max_tokens, self.response_cap or sampling.max_tokens)
        ends = set(ending_tokens(sampling, self.eos_token_ids))
        out = []
        for ids in prompt_token_ids:
            base = prompt_seed(self.seed if sampling.seed is None else sampling.seed, ids)
            out.append([self._one(ids, sampling, budget, ends, base + j) for j in range(sampling.n)])
        return out

    def _one(self, ids: list[int], sampling: SamplingParams, budget: int, ends: set[int], seed: int) -> Completion:
        generator = torch.Generator().manual_seed(seed)
        tokens: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        while len(tokens) < budget:
            logits = self.model(torch.tensor([ids + tokens], device=self.device)).logits[0, -1].float().cpu()
            if sampling.temperature == 0:
                scores = torch.log_softmax(logits, -1)
                token = int(scores.argmax())
            else:
                scores = torch.log_softmax(logits / sampling.temperature, -1)
                token = int(torch.multinomial(scores.exp(), 1, generator=generator))
            tokens.append(token)
            logprobs.append(float(scores[token]))
            if token in ends and len(tokens) >= sampling.min_tokens:
                finish = "stop"
                break
        return Completion(list(ids), tokens, logprobs, finish, response_text(self.tokenizer, tokens, sampling.stop))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        with torch.no_grad():
            for name, tensor in weights:
                self._weights[name].copy_(tensor)
        self.policy_version = policy_version
