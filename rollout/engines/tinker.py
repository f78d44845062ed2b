"""engine_type tinker: generation by a Tinker service's sampler (the official `tinker` SDK's
SamplingClient), for runs whose trainer is that service (trainer.remote: tinker://...).

A Tinker service keeps the weights it trains: the engines of such a run cannot receive tensors, and
load a version by the path `save_weights_for_sampler` returned (`load_checkpoint("tinker://...")`,
the checkpoint transport's receiving half). Everything around generation stays rlcore's: the rollout
worker, its workflows, rewards, tools and OpenAI door; the tokenizer is the local model folder's.

Each prompt is one `sample` request (num_samples = n), all of a call's requests in flight at once,
each with the call's seed: a sampler seeds a request by its seed and prompt (rlcore's server derives
each prompt's seed as rlcore's engines do, so a seeded rollout samples what the local HF engine would
with the same weights). The log-probs are the sampler's, at the request's temperature.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...core.types import Completion, SamplingParams
from .base import (
    RolloutEngine,
    check_prompts,
    ending_tokens,
    refuse_routed_experts,
    refuse_scores,
    refuse_structured,
    resolve_max_model_len,
    response_text,
    stop_token_ids,
)


@dataclass(frozen=True)
class ServiceSpec:
    """The Tinker service an engine samples from."""

    url: str
    """Its base URL (http://host:port or https://host/path)."""
    base_model: str
    """The base model's name there (what create_lora_training_client was given)."""
    api_key_env: str = "TINKER_API_KEY"
    """The environment variable holding its API key."""


UNSERVED = {
    "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0,
}  # fmt: skip
"""SamplingParams fields a Tinker sampler has no counterpart for, with the value that means "off"."""
CLOSE_TIMEOUT_S = 2.0
"""The longest `close` waits for the service to finish the engine's session (one request)."""


class TinkerEngine(RolloutEngine):
    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int | None = None,
        max_batch_size: int = 256,
        enforce_eager: bool = False,
        service_url: str = "",
        service_model: str = "",
        service_key_env: str = "TINKER_API_KEY",
    ):
        """`model_path`: a local HF folder (or hub id) of the service's base model, for the tokenizer
        and the position limit; `service_url`: where to sample (a run's tinker:// trainer, or
        --service-url), `service_model` its base model's name there (default: model_path),
        `service_key_env` the variable holding its API key. device, dtype and the batch size are the
        service's business and ignored here."""
        if not service_url:
            raise ValueError(
                "the tinker engine samples from a Tinker service: give its URL (--service-url http://HOST:PORT, "
                "or trainer.remote tinker://HOST:PORT in a run)"
            )
        service = ServiceSpec(service_url, service_model or model_path, service_key_env)
        try:
            import tinker
        except ImportError as e:
            raise ImportError(
                f"the tinker engine needs the tinker SDK ({e}): pip install 'rlcore[tinker]'"
            ) from None
        from transformers import AutoTokenizer, GenerationConfig

        api_key = os.environ.get(service.api_key_env, "")
        if not api_key:
            raise ValueError(f"${service.api_key_env} is empty: set the Tinker service's API key there")
        self.max_model_len = resolve_max_model_len(model_path, max_model_len)
        self.max_batch_size = max_batch_size
        """Sequences one call holds (the rollout worker splits its work by it)."""
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        try:  # a chat model may end turns on several ids (its generation config names them)
            generation_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        except OSError:
            generation_eos = None
        self.eos_token_ids = stop_token_ids(generation_eos, self.tokenizer, model_path)
        self.service = service
        self._types = tinker.types
        try:
            self._client = tinker.ServiceClient(base_url=service.url, api_key=api_key)
            self._sampler = self._client.create_sampling_client(base_model=service.base_model).result()
        except tinker.APIError as e:
            raise ValueError(
                f"the Tinker service at {service.url} refused a sampler of {service.base_model}: {e}"
            ) from None
        self.sampler_path = ""
        """The sampler weights served now ("": the base model)."""
        self.policy_version = 0

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        check_prompts(prompt_token_ids, sampling.max_tokens, self.max_model_len)
        refuse_routed_experts(sampling, "tinker")
        refuse_scores(sampling, "tinker")
        refuse_structured(sampling, "tinker")
        params = self._params(sampling)
        sampler = self._sampler  # a load between the requests must not split one call's prompts
        futures = [
            sampler.sample(self._types.ModelInput.from_ints(list(ids)), sampling.n, params)
            for ids in prompt_token_ids
        ]
        out = []
        for ids, future in zip(prompt_token_ids, futures, strict=True):
            completions = []
            for s in future.result().sequences:
                if s.logprobs is None:
                    raise RuntimeError(
                        f"the Tinker sampler at {self.service.url} returned a sample without log-probs"
                    )
                completions.append(Completion(
                    prompt_token_ids=list(ids), token_ids=list(s.tokens), logprobs=[float(x) for x in s.logprobs],
                    finish_reason=s.stop_reason, text=response_text(self.tokenizer, list(s.tokens), sampling.stop),
                ))  # fmt: skip
            out.append(completions)
        return out

    def _params(self, sampling: SamplingParams) -> Any:
        """Tinker's SamplingParams for `sampling`; ValueError naming a field Tinker cannot honour."""
        for name, off in UNSERVED.items():
            if getattr(sampling, name) != off:
                raise ValueError(
                    f"{name}: a Tinker sampler has none; leave it at {off} with engine_type tinker"
                )
        if sampling.logit_bias:
            raise ValueError("logit_bias: a Tinker sampler has none; leave it empty with engine_type tinker")
        stop: list[Any] | None = None
        if sampling.stop and sampling.stop_token_ids:
            raise ValueError("a Tinker sampler stops on strings or on token ids, not both: give one of them")
        if sampling.stop:
            if sampling.ignore_eos:
                raise ValueError(
                    "a Tinker sampler stopping on strings stops on EOS too: drop ignore_eos or the stop strings"
                )
            stop = list(sampling.stop)
        elif sampling.stop_token_ids or sampling.ignore_eos:
            stop = ending_tokens(sampling, self.eos_token_ids)  # [] stops nowhere, EOS included
        return self._types.SamplingParams(
            max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, seed=sampling.seed, stop=stop,
        )  # fmt: skip

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        """Serve the sampler weights at `path` (a tinker:// path save_weights_for_sampler returned)."""
        if not path.startswith("tinker://"):
            raise ValueError(f"the tinker engine loads sampler weights by tinker:// path; got {path}")
        self._sampler = self._client.create_sampling_client(model_path=path).result()
        self.sampler_path = path
        self.policy_version = policy_version

    def load_weights(self, weights: Iterable[tuple[str, Any]], policy_version: int) -> None:
        raise ValueError(
            "the tinker engine's weights stay in the Tinker service: they reach it as sampler paths "
            "(synchronizer.sync_method checkpoint), not as tensors"
        )

    def join_weight_sync(self, *args: Any, **kwargs: Any) -> None:
        self.load_weights((), 0)

    def close(self) -> None:
        """Finish this engine's session with the service (its heartbeats stop); a worker stopping
        because the service was lost does not wait for it longer than CLOSE_TIMEOUT_S."""
        try:
            self._client.close("success").result(timeout=CLOSE_TIMEOUT_S)
        except Exception:  # the service may be gone already; nothing of ours is left open
            pass
