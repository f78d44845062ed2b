"""A distillation teacher behind an OpenAI-compatible service (`model.teacher_service`, a name in
explorer.auxiliary_models): each rank asks it for the log-prob of every token of its micro-batches'
sequences, one /v1/completions request per micro-batch with the rows' token ids as the prompts,
`echo` and `logprobs: 0` (the legacy completions API's prompt log-probs, which vLLM's and SGLang's
servers and rlcore's own door answer) and one generated token, which is dropped.

The service must serve a model with the student's tokenizer (the ids are sent as they are) and a
context of at least model.max_model_len + 1 tokens. Its log-probs are of the raw distribution, so
config validation asks for sampling at temperature 1. A service that fails or answers without
prompt log-probs is one line naming it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..batch import Batch
from ..services import auxiliary_models, openai_client


class TeacherServiceError(RuntimeError):
    """The teacher service failed or did not return prompt log-probs: one line naming it."""


class ServiceTeacher:
    """`compute_logprobs(mbs, temperature)` as a frozen teacher model's, from the service."""

    def __init__(self, cfg: Any):
        name = cfg.model.teacher_service
        specs = {s["name"]: s for s in auxiliary_models(cfg)}
        assert name in specs, "config validation checks model.teacher_service against the auxiliary models"
        self.spec = specs[name]
        self.name = name
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = openai_client(self.spec, f"teacher service '{self.name}'")
            except ValueError as e:
                raise TeacherServiceError(str(e)) from None
        return self._client

    def _ask(self, prompts: list[list[int]]) -> list[list[float]]:
        """Each prompt's per-token log-probs (the first, which nothing predicts, 0), in order."""
        try:
            answer = self.client.completions.create(
                model=self.spec["model_name"],
                prompt=prompts,
                max_tokens=1,
                temperature=1.0,
                echo=True,
                logprobs=0,
            )
        except TeacherServiceError:
            raise
        except Exception as e:  # openai.APIError and connection failures
            raise TeacherServiceError(
                f"teacher service '{self.name}' ({self.spec['model_name']}) failed: {type(e).__name__}: {e}"
            ) from None
        out: list[list[float]] = [[] for _ in prompts]
        for choice in answer.choices:
            lps = choice.logprobs.token_logprobs if choice.logprobs is not None else None
            n = len(prompts[choice.index])
            if not lps or len(lps) < n or any(v is None for v in lps[1:n]):
                raise TeacherServiceError(
                    f"teacher service '{self.name}' answered without the prompt's log-probs (echo with logprobs): "
                    "serve the teacher with a server that returns them (vLLM, SGLang, rlcore's door on the hf engine)"
                )
            out[choice.index] = [0.0] + [float(v) for v in lps[1:n]]
        return out

    def compute_logprobs(self, micro_batches: list[Batch], temperature: float) -> list[torch.Tensor]:
        """[B, T] per micro-batch: position t the teacher's log-prob of input_ids[t] (0 at position 0,
        on padding and on rows that train no token)."""
        if temperature != 1.0:  # config validation asks for sampling at 1
            raise TeacherServiceError(
                f"teacher service '{self.name}' scores at temperature 1, and this step sampled at {temperature}"
            )
        out = []
        for mb in micro_batches:
            lp = torch.zeros(mb["input_ids"].shape, dtype=torch.float32)
            lengths = mb["attention_mask"].sum(-1).tolist()
            rows = [b for b, n in enumerate(lengths) if n > 1 and float(mb["loss_mask"][b].sum()) > 0]
            if rows:
                prompts = [mb["input_ids"][b, : lengths[b]].tolist() for b in rows]
                for b, lps in zip(rows, self._ask(prompts), strict=True):
                    lp[b, 1 : lengths[b]] = torch.tensor(lps[1:], dtype=torch.float32)
            out.append(lp)
        return out
