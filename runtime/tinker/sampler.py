"""The Tinker server's sampling engine: rlcore's HF engine over the served base model, loading the
weights a sampler names (an HF folder the trainer exported, or the base model's own) before it
samples. One engine, one set of weights at a time: requests for other weights wait their turn.
Concurrent requests for the same weights and sampling parameters share engine calls (rlcore's
BatchingEngine, as the OpenAI door's do): an RL loop's prompts of one step are one batch. The
engine seeds each prompt by itself, so a request samples the same tokens whatever it shares a
call with."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from ...core.rpc.convert import sampling_from_proto, sampling_to_proto
from ...core.rpc.errors import InvalidArgument
from ...core.types import SamplingParams
from ...rollout.batching import BatchingEngine
from ...rollout.engines.base import iter_safetensors
from .errors import UserError
from .wire import PromptTopk, Sampled, sample_response


def sampling_params(params: Any, num_samples: int) -> SamplingParams:
    """Tinker's SamplingParams (max_tokens, seed, stop, temperature, top_k, top_p) as rlcore's, checked
    by the rule every rlcore door applies (core/rpc/convert.sampling_from_proto). `stop`: strings, or
    token ids (each ends a sample like EOS); [] turns every stop off, EOS too."""
    stop = params.stop
    strings: list[str] = []
    stop_ids: list[int] = []
    if isinstance(stop, str):
        strings = [stop]
    elif stop:
        if all(isinstance(s, str) for s in stop):
            strings = list(stop)
        elif all(isinstance(s, int) for s in stop):
            stop_ids = [int(s) for s in stop]
        else:
            raise UserError("sampling_params.stop: strings or token ids, not both")
    if params.max_tokens is None:
        raise UserError("sampling_params.max_tokens: required here (the largest number of tokens to sample)")
    if num_samples < 1:
        raise UserError(f"num_samples: must be >= 1; got {num_samples}")
    if not 0 < params.top_p <= 1:  # on the wire 0 means unset (1): here it is a mistake
        raise UserError(f"sampling_params.top_p: must be in (0, 1]; got {params.top_p}")
    sampling = SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, n=num_samples,
        max_tokens=params.max_tokens, stop=strings, seed=params.seed, stop_token_ids=stop_ids,
        ignore_eos=stop is not None and len(stop) == 0,
    )  # fmt: skip
    try:
        return sampling_from_proto(sampling_to_proto(sampling), "sampling_params")
    except InvalidArgument as e:
        raise UserError(str(e)) from None
    except ValueError as e:  # a value the wire's type cannot hold (a negative seed)
        raise UserError(f"sampling_params: {e}") from None


DROPPED = (
    "sampling_session_id: the weights it samples were dropped (deleted, or older than the unnamed sampler "
    "weights the server keeps per model: `rlcore tinker serve --keep-samplers`): sample from a newer "
    "save_weights_and_get_sampling_client, or save named sampler weights"
)

LINGER_S = 0.01
"""How long a request that finds the engine idle waits for others to share its call."""


class _WithWeights:
    """The engine as it generates under one folder's weights (loaded first, under the engine lock
    the BatchingEngine holds around each call)."""

    def __init__(self, sampler: Sampler, folder: str):
        self.sampler, self.folder = sampler, folder

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> Any:
        self.sampler._hold(self.folder)
        return self.sampler.engine.generate(prompts, sampling)

    def continuous_batch(self) -> None:
        """None: a call loads its folder's weights first, so calls of one folder are merged whole
        (a running batch would decode under whichever folder's weights the engine held)."""
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler.engine, name)


class Sampler:
    """The engine, the folder whose weights it holds, and a BatchingEngine per folder."""

    def __init__(self, base_path: str, device: str, dtype: str, max_model_len: int):
        from ...rollout.engines.hf import HFEngine

        self.base_path = base_path
        self.engine = HFEngine(base_path, device=device, dtype=dtype, max_model_len=max_model_len)
        self.holds: str | None = base_path
        self.version = 0
        self.lock = threading.Lock()
        """The engine's: every engine call and weight load holds it."""
        self._batchers: dict[str, BatchingEngine] = {}
        self._batchers_lock = threading.Lock()

    def _hold(self, folder: str) -> None:
        if self.holds != folder:
            if not os.path.isdir(folder):
                raise UserError(DROPPED)
            self.version += 1
            self.holds = None  # a load that fails halfway leaves weights of no folder
            self.engine.load_weights(iter_safetensors(folder), self.version)
            self.holds = folder

    def sample(
        self, folder: str, prompt: list[int], params: Any, num_samples: int, prompt_logprobs: bool, topk: int = 0
    ) -> bytes:
        """SampleResponse bytes of `num_samples` samples of `prompt` under the weights in `folder`, with
        the prompt's log-probs and the `topk` likeliest tokens at each prompt position when asked."""
        if not prompt:
            raise UserError("prompt: holds no tokens")
        vocab = self.engine.model.config.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise UserError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab})")
        limit = self.engine.max_model_len
        sampling = sampling_params(params, num_samples)
        bad = next((t for t in sampling.stop_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise UserError(f"sampling_params.stop: token id {bad} is outside the vocabulary [0, {vocab})")
        if topk > vocab:
            raise UserError(f"topk_prompt_logprobs: {topk} exceeds the vocabulary ({vocab} tokens)")
        if len(prompt) + sampling.max_tokens > limit:
            raise UserError(f"prompt ({len(prompt)} tokens) + sampling_params.max_tokens ({sampling.max_tokens}) "
                            f"exceeds the served context of {limit} tokens")  # fmt: skip
        with self._batchers_lock:
            batcher = self._batchers.get(folder)
            if batcher is None:
                for gone in [f for f in self._batchers if not os.path.isdir(f)]:
                    del self._batchers[gone]
                batcher = self._batchers[folder] = BatchingEngine(_WithWeights(self, folder), self.lock)  # type: ignore[arg-type]
        (completions,), _ = batcher.generate_versioned([prompt], sampling, LINGER_S)
        scored = top = None
        if prompt_logprobs or topk:
            with self.lock:
                self._hold(folder)
                scored, top = self._prompt_logprobs(prompt, topk)
        samples = [Sampled(c.token_ids, c.logprobs, c.finish_reason == "stop") for c in completions]
        return sample_response(samples, scored if prompt_logprobs else None, top)

    @torch.no_grad()
    def _prompt_logprobs(self, prompt: list[int], topk: int) -> tuple[list[float], PromptTopk | None]:
        """log p(prompt[i] | prompt[:i]) for i >= 1, by the function the trainer scores with, and the
        `topk` likeliest tokens after each prompt[:i] with their log-probs (none when topk is 0)."""
        from ...rollout.engines.hf_running import score_prompt

        scored, top = score_prompt(self.engine.model, prompt, topk)
        if top is None:
            return scored, None
        tokens, values = top
        return scored, PromptTopk(tokens.cpu().numpy(), values.cpu().numpy())
