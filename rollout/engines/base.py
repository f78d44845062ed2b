"""The RolloutEngine interface: what the explorer needs from an inference engine."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ...core.types import Completion, SamplingParams

if TYPE_CHECKING:
    import torch

    from ...weights.wire import SyncGroup, TensorSpec
    from .adapters import ResidentAdapters


class RolloutEngine(ABC):
    """Generates completions for token-id prompts and takes new weights from the trainer.

    Construction: `Engine(model_path, *, device, dtype, max_model_len, max_batch_size, **options)`: its
    keyword parameters beyond those four are its options (spec.py says which settings reach them).

    Weights arrive three ways: `load_weights` (full tensors in this process: colocated runs),
    `join_weight_sync` + `receive_weights` (buckets over a process group from a trainer rank) and
    `load_checkpoint` (an HF folder on disk). The defaults receive in this process; an engine whose
    model lives in other processes (vLLM) overrides them to receive there.
    """

    policy_version: int = 0
    """Version of the weights loaded now (the trainer step that produced them)."""
    weight_sync_ranks: int = 1
    """Ranks this engine takes in a weight-sync group (one per process that receives)."""
    tokenizer: Any
    """The served model's HF tokenizer (workflows encode prompts and decode with it)."""
    max_model_len: int
    """Longest prompt + response in tokens (the worker reports it; requests past it are refused)."""
    max_batch_size: int
    """Sequences one `generate` call holds (the rollout worker merges concurrent calls up to it)."""
    sleeping: bool = False
    """Whether `sleep` has released the engine's memory."""
    interruptible: bool = False
    """Whether `generate` ends early once `interrupt` is set (partial rollouts): the sequences still
    decoding then come back with their tokens so far and finish_reason "interrupted"."""
    interrupt: threading.Event | None = None
    """Set by the worker's generation gate when a weight update waits (interruptible engines)."""
    merges_adapters: bool = False
    """Whether `load_weights` takes an adapter-only sync's entries (LoRA factors and scales, merged
    into the base weights it reads from its model folder: weights/adapter.py), so a LoRA run may
    send the adapter alone (synchronizer.lora_sync)."""
    adapters: ResidentAdapters | None = None
    """LoRA adapters held beside the weights, one chosen per request by SamplingParams.adapter
    (adapters.py); None: the engine serves none."""
    _sync_group: SyncGroup | None = None

    @abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """Return, for each prompt, `sampling.n` completions (in a deterministic order)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Replace the weights with full tensors keyed by HF parameter name, in process."""

    def join_weight_sync(
        self, master_address: str, master_port: int, world_size: int, first_rank: int, backend: str,
        timeout_s: float, group_name: str,
    ) -> None:  # fmt: skip
        """Join a weight-sync group at ranks first_rank .. first_rank + weight_sync_ranks - 1
        (blocks until the group formed); replaces any earlier group."""
        from ...weights.wire import init_group

        self._sync_group = None
        self._sync_group = init_group(
            master_address, master_port, world_size, first_rank, backend, timeout_s, group_name
        )

    def receive_weights(
        self,
        specs: list[TensorSpec],
        bucket_bytes: int,
        policy_version: int,
        *,
        checksums: bool,
        stats: dict[str, float],
        on_phase: Callable[[str], None] = lambda phase: None,
    ) -> None:
        """Receive one version's buckets from the group and load them: large tensors straight into
        `weight_destinations()`, the rest through `load_weights`. With checksums nothing is loaded
        unless every bucket checks out (WeightCorruption otherwise)."""
        from ...weights.wire import receive_weights

        assert self._sync_group is not None, "join_weight_sync first"
        weights = receive_weights(
            self._sync_group, specs, bucket_bytes, str(getattr(self, "device", "cpu")), stats,
            checksums=checksums, version=policy_version, into=self.weight_destinations().get,
        )  # fmt: skip
        self.load_weights(_tracked(weights, on_phase), policy_version)

    def weight_destinations(self) -> Mapping[str, torch.Tensor]:
        """HF name -> the engine's own tensor that received bytes may be written into directly
        (where dtype and shape match). Default: none, everything goes through `load_weights`."""
        return {}

    @property
    def sync_group(self) -> SyncGroup | None:
        """The weight-sync group this process joined (None before `join_weight_sync`)."""
        return self._sync_group

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        """Load the weights of an HF model folder (safetensors files)."""
        self.load_weights(iter_safetensors(path), policy_version)

    def load_adapter(self, name: str, path: str) -> None:
        """Hold the peft adapter folder at `path` under `name` (ValueError in one line when it cannot)."""
        if self.adapters is None:
            raise ValueError(f"the {type(self).__name__} serves no LoRA adapters beside its weights (the hf engine does)")
        self.adapters.load(name, path)

    def unload_adapter(self, name: str) -> None:
        """Drop adapter `name` (adapters.AdapterNotHeld when it is not held)."""
        from .adapters import not_held

        if self.adapters is None:
            raise not_held(name, ())
        self.adapters.unload(name)

    def adapter_names(self) -> dict[str, str]:
        """The adapters held: name -> the folder each was loaded from."""
        return {} if self.adapters is None else self.adapters.names()

    def continuous_batch(self) -> EngineBatch | None:
        """A batch that requests join and leave at token boundaries, each with its own sampling
        (continuous batching), or None: the engine decodes one `generate` call at a time (the
        batching engine then merges concurrent calls with equal sampling)."""
        return None

    def pause(self) -> None:
        """Stop accepting work (before a weight update). Default: nothing to do for in-process engines."""
        return None

    def resume(self) -> None:
        """Accept work again."""
        return None

    def sleep(self) -> None:
        """Release the KV cache and offload the weights while the trainer has the GPU (colocated,
        explorer.rollout_model.enable_sleep_mode; validation allows it for engines that have it)."""
        raise NotImplementedError(f"{type(self).__name__} has no sleep mode")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what `sleep` released: `tags` among "weights" and "kv_cache" (all when None)."""
        raise NotImplementedError(f"{type(self).__name__} has no sleep mode")

    def close(self) -> None:
        """Release the engine's resources."""
        return None


TokensOut = Callable[[list[int], list[int]], None]
"""A streaming caller's view of a request's tokens as they are sampled: after each step, the rows
that sampled one (row r: prompt r // n, sample r % n) and their tokens."""


class EngineBatch(Protocol):
    """An engine's running batch (continuous batching). A request added decodes from the next
    `step` on, beside the requests running, with its own sampling; `step` decodes one token for
    every running row and returns the requests it finished, by the id `add` gave them."""

    @property
    def rows(self) -> int:
        """Sequences decoding now."""

    def admits(self, num_prompts: int, sampling: SamplingParams) -> bool:
        """Whether a request of `num_prompts` prompts under `sampling` may join now (room, and what
        the running requests must share with it)."""

    def add(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams,
        on_tokens: TokensOut | None = None,
    ) -> int:  # fmt: skip
        """Start a request (ValueError in one line for one the engine cannot serve); `on_tokens` is
        called after each step with the request's rows that sampled a token and their tokens."""

    def step(self) -> dict[int, list[list[Completion]] | Exception]:
        """One token for every running row; the requests finished: id -> each prompt's completions,
        or the error that ended that request alone (its structured output found no way on)."""


def stop_token_ids(generation_eos: int | list[int] | None, tokenizer: Any, model_path: str) -> list[int]:
    """Every id a response may end on: the generation config's EOS ids (a chat model may end turns
    on several) plus the tokenizer's EOS."""
    ids = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    assert ids, f"{model_path} defines no EOS token"
    return ids


def check_prompts(prompt_token_ids: list[list[int]], max_tokens: int, max_model_len: int) -> None:
    """ValueError in one line for a request no engine can serve: no token to generate, an empty
    prompt, or a prompt whose response budget runs past max_model_len."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1; got {max_tokens}")
    for i, ids in enumerate(prompt_token_ids):
        if not ids:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if len(ids) + max_tokens > max_model_len:
            raise ValueError(
                f"prompt {i}: {len(ids)} prompt tokens + max_tokens {max_tokens} exceed "
                f"max_model_len {max_model_len}; shorten the prompt or lower max_tokens"
            )


def refuse_routed_experts(sampling: SamplingParams, engine: str, why: str = "") -> None:
    """ValueError in one line when `sampling` asks for routing records from an engine that keeps none."""
    if sampling.return_routed_experts:
        raise ValueError(
            f"the {engine} engine does not record the experts it routes tokens to (rollout routing "
            f"replay){': ' + why if why else ''}; use the hf engine, or algorithm.router_replay: none"
        )


def refuse_scores(sampling: SamplingParams, engine: str) -> None:
    """ValueError in one line when `sampling` asks for prompt or top-k log-probs from an engine that
    does not return them."""
    if sampling.prompt_logprobs or sampling.top_logprobs:
        what = "prompt log-probs (echo)" if sampling.prompt_logprobs else "top-k log-probs (top_logprobs)"
        raise ValueError(f"the {engine} engine does not return {what}; serve the model with the hf engine")


class StructuredOutputRefused(ValueError):
    """An engine cannot serve a request's structured output (SamplingParams.structured_output): the
    door answers it as a 400 naming response_format, whatever the engine."""


def refuse_structured(sampling: SamplingParams, engine: str) -> None:
    """StructuredOutputRefused in one line when `sampling` asks for structured output from an engine without it."""
    if sampling.structured_output is not None:
        raise StructuredOutputRefused(
            f"structured output: the {engine} engine does not hold its sampling to a grammar; serve the model "
            "with the hf or vllm engine"
        )


def refuse_grammar_conflicts(sampling: SamplingParams) -> None:
    """StructuredOutputRefused in one line for settings a grammar cannot keep: min_tokens (the
    grammar may end the text sooner) and ignore_eos (the grammar ends it)."""
    if sampling.min_tokens:
        raise StructuredOutputRefused("structured output with min_tokens: the grammar may end the text sooner; drop min_tokens")
    if sampling.ignore_eos:
        raise StructuredOutputRefused("structured output with ignore_eos: the grammar ends the text; drop ignore_eos")


def response_text(tokenizer: Any, token_ids: list[int], stop: list[str]) -> str:
    """A response's text: special tokens dropped, cut before the first stop string it holds."""
    text = str(tokenizer.decode(token_ids, skip_special_tokens=True))
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(cuts)] if cuts else text


def ending_tokens(sampling: SamplingParams, eos_token_ids: list[int]) -> list[int]:
    """The tokens that end a response under `sampling`: EOS unless ignored, and stop_token_ids."""
    return sorted(set(([] if sampling.ignore_eos else eos_token_ids) + sampling.stop_token_ids))


def prompt_seed(seed: int, prompt_token_ids: list[int]) -> int:
    """The seed of one prompt's samples, a function of the request's seed and the prompt alone: a
    seeded request reproduces a prompt's completions whatever else it is batched with (sample j
    takes this + j, as vLLM gives a request's j-th child). Different prompts draw independently."""
    digest = hashlib.blake2b(f"{seed}:{','.join(map(str, prompt_token_ids))}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 2  # room for + j below 2**63


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""config.json keys that hold a model's position limit, in the order HF architectures use them."""


def position_limit(model_path: str) -> int | None:
    """The most positions the model at `model_path` holds (its config.json), None if it names none.
    Read as JSON where config.json says it (importing transformers' model configs costs a launch
    seconds before anything runs); else as transformers reads it, with its class defaults."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        raw = None
    if isinstance(raw, dict):
        found = _position_key(raw.get("text_config") or raw)  # multimodal configs nest the LM's
        if found is not None:
            return found
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    config = getattr(config, "text_config", None) or config
    return _position_key(config.to_dict())


def _position_key(config: dict[str, Any]) -> int | None:
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def resolve_max_model_len(model_path: str, requested: int | None, key: str = "max_model_len") -> int:
    """`requested`, or the model's own position limit when None; ValueError naming `key` when the
    request exceeds the limit (a longer sequence would run past the positions the model learnt)."""
    limit = position_limit(model_path)
    if requested is None:
        if limit is None:
            raise ValueError(
                f"{model_path}/config.json names no position limit ({', '.join(POSITION_KEYS)}); set {key}"
            )
        return limit
    if limit is not None and requested > limit:
        raise ValueError(
            f"{key} {requested} exceeds the {limit} positions the model at {model_path} holds "
            f"(config.json); set {key} to at most {limit}"
        )
    return requested


def copy_completion(c: Completion) -> Completion:
    """An independent copy (greedy samples are decoded once and copied n times)."""
    return replace(
        c, prompt_token_ids=list(c.prompt_token_ids), token_ids=list(c.token_ids), logprobs=list(c.logprobs),
        prompt_logprobs=list(c.prompt_logprobs), top_logprobs=list(c.top_logprobs),
    )  # fmt: skip


def iter_safetensors(path: str) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every *.safetensors file in an HF model folder, file by file."""
    import glob
    import os

    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, f.get_tensor(name)


def _tracked(weights: Iterator[Any], on_phase: Callable[[str], None]) -> Iterator[Any]:
    """Pass `weights` through, reporting whether the update is receiving or loading."""
    while True:
        on_phase("receiving")
        try:
            item = next(weights)
        except StopIteration:
            return
        on_phase("loading")
        yield item
