"""The embedded engine: a HF transformers causal LM in the calling process, decoded by rlcore's loop
over the model's forward and KV cache (hf_decode.py: one prefill per prompt). On a GPU the decode
runs over a static cache, each step a CUDA graph replay (hf_static.py); on CPU, or with
enforce_eager, over transformers' dynamic cache, finished rows leaving the batch. Either way
concurrent requests share a running batch (`continuous_batch`, hf_running.py): they join it at
token boundaries, each with its own sampling, and leave it when they end.

It is the default because it needs nothing beyond transformers, loads in a second and takes new
weights by an in-place copy, which is what colocated and CPU runs want. Log-probs are computed
from the raw logits under temperature only, the distribution the trainer recomputes, so that the
importance ratio at step 0 is exactly 1 whatever top-k/top-p/min-p/repetition penalty did to the
sampler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig
from transformers.generation.stopping_criteria import StopStringCriteria

from ...core import moe_routing
from ...core.types import Completion, SamplingParams
from ...weights.adapter import merge_adapters
from .adapters import ResidentAdapters
from .base import (
    RolloutEngine,
    TokensOut,
    check_prompts,
    copy_completion,
    prompt_seed,
    refuse_grammar_conflicts,
    resolve_max_model_len,
    response_text,
    stop_token_ids,
)
from .hf_attention import use_grouped_sdpa
from .hf_decode import decode, decode_static
from .hf_dynamic_batch import full_attention
from .hf_grammar import Grammars, RowGrammars
from .hf_running import DecodedRows, Group, RunningBatch
from .hf_sampling import TextStopStrings
from .hf_static import StaticDecodeStates, supports
from .hf_static_batch import StaticRows

logger = logging.getLogger(__name__)

CHECK_EVERY = 8
"""On a GPU the host asks which rows are done once per this many decode steps (the steps in between
run without a host sync; a row decodes at most this many - 1 steps past its end, those tokens cut)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine(RolloutEngine):
    """A causal LM decoded with its KV cache, in batches of at most `max_batch_size` sequences."""

    interruptible = True
    merges_adapters = True

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int | None = None,
        max_batch_size: int = 256,
        enforce_eager: bool = False,
        max_loras: int = 8,
        static_cache: bool | None = None,
    ):
        """`max_loras`: LoRA adapters it may hold beside its weights (adapters.py; 0: none).
        `static_cache`: decode over the static cache (hf_static.py); None: on CUDA unless
        enforce_eager. True elsewhere runs it without CUDA graphs (the GPU path, seen on CPU)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got '{dtype}'")
        self.device = torch.device(device)
        self.max_model_len = resolve_max_model_len(model_path, max_model_len)
        self.max_batch_size = max_batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
        self.model = model.to(self.device)
        self.model.eval()
        use_grouped_sdpa(self.model)
        # Weights change in place only (load_weights copies into them), so this name -> tensor map,
        # taken once, stays valid; a state_dict() walk per sync cost more than small models' copies.
        self._weights: dict[str, torch.Tensor] = self.model.state_dict()
        self._adapter_bases: dict[str, torch.Tensor] = {}  # what adapter-only syncs merge into
        self.adapters = ResidentAdapters(self.model, max_loras)
        eos_ids = stop_token_ids(self.model.generation_config.eos_token_id, self.tokenizer, model_path)
        self.eos_token_ids = eos_ids
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = eos_ids[0] if pad is None else pad
        # Sampling comes from SamplingParams only: a blank config keeps the checkpoint's
        # generation_config.json (top_k=20, temperature=0.6, ...) out of any generate call.
        self.model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=self.pad_token_id)
        self.policy_version = 0
        self._grammars: Grammars | None = None
        self._static: StaticDecodeStates | None = None
        cuda = self.device.type == "cuda"
        if (cuda and not enforce_eager) if static_cache is None else static_cache:
            why_not = supports(self.model.config, max_batch_size, self.model.dtype.itemsize)
            if why_not is None:
                self._static = StaticDecodeStates(
                    self.model, max_batch_size, self.max_model_len, use_graphs=cuda and not enforce_eager
                )
            else:
                logger.warning("HF engine: eager decoding on %s (no static cache: %s)", self.device, why_not)

    # ------------------------------------------------------------------------------------------
    # generation

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        check_prompts(prompt_token_ids, sampling.max_tokens, self.max_model_len)
        # Greedy samples are all equal: decode once per prompt and copy.
        n = 1 if sampling.temperature == 0 else sampling.n
        matcher = TextStopStrings(self.tokenizer, sampling.stop) if sampling.stop else None
        seeds = (
            None if sampling.seed is None else [prompt_seed(sampling.seed, ids) for ids in prompt_token_ids]
        )
        assert self.adapters is not None  # built with the engine
        with self.adapters.active(sampling.adapter):
            return self._generate(prompt_token_ids, sampling, n, matcher, seeds)

    def _generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, n: int,
        matcher: StopStringCriteria | None, seeds: list[int] | None,
    ) -> list[list[Completion]]:  # fmt: skip
        out: list[list[Completion]] = [[] for _ in prompt_token_ids]
        for indices, count in self._plan_chunks(len(prompt_token_ids), n):
            chunk = [prompt_token_ids[i] for i in indices]
            # sample j of prompt i draws from seed_i + j (j counts on across shares of a large n)
            row_seeds = (
                None if seeds is None else [seeds[i] + len(out[i]) + j for i in indices for j in range(count)]
            )
            if (
                self.interrupt is not None and self.interrupt.is_set()
            ):  # not started: all of it continues later
                completions = [
                    Completion(list(p), [], [], "interrupted") for p in chunk for _ in range(count)
                ]
            else:
                completions = self._generate_chunk(chunk, count, sampling, matcher, row_seeds)
            for j, i in enumerate(indices):
                out[i].extend(completions[j * count : (j + 1) * count])
        if n != sampling.n:
            out = [[copy_completion(c) for _ in range(sampling.n)] for (c,) in out]
        return out

    def _plan_chunks(self, num_prompts: int, n: int) -> list[tuple[list[int], int]]:
        """Split the work into generate calls of at most max_batch_size sequences.

        Each call is (prompt indices, num_return_sequences). When n exceeds max_batch_size each
        prompt is submitted in shares of n; the caller appends results in call order, which keeps
        every prompt's samples in share order.
        """
        per_call = min(n, self.max_batch_size)
        shares = [per_call] * (n // per_call) + ([n % per_call] if n % per_call else [])
        chunks = []
        for count in shares:
            step = self.max_batch_size // count
            for start in range(0, num_prompts, step):
                chunks.append((list(range(start, min(start + step, num_prompts))), count))
        return chunks

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        matcher: StopStringCriteria | None,
        row_seeds: list[int] | None,
    ) -> list[Completion]:
        """Generate n completions for each prompt in one batch."""
        eos, pad = self.eos_token_ids, self.pad_token_id
        # an adapter's hooks are in no CUDA graph, scores are the eager loop's
        scores = sampling.prompt_logprobs or sampling.top_logprobs
        grammar = self.grammar(sampling, prompts, n)  # masks drawn per step: the eager loop's
        if self._static is not None and not sampling.adapter and not scores and grammar is None:
            rows = decode_static(self._static, prompts, n, sampling, eos_token_ids=eos, pad_token_id=pad,
                                 stop_matcher=matcher, row_seeds=row_seeds, check_every=CHECK_EVERY,
                                 interrupt=self.interrupt, routing=sampling.return_routed_experts)  # fmt: skip
        elif sampling.return_routed_experts:
            rows = decode(self.model, prompts, n, sampling, eos_token_ids=eos, pad_token_id=pad,
                          stop_matcher=matcher, row_seeds=row_seeds, interrupt=self.interrupt,
                          routing=moe_routing.RoutingRecorder(self.model), grammar=grammar)  # fmt: skip
        else:
            rows = decode(self.model, prompts, n, sampling, eos_token_ids=eos, pad_token_id=pad,
                          stop_matcher=matcher, row_seeds=row_seeds, interrupt=self.interrupt,
                          grammar=grammar)  # fmt: skip
        return self.completions(prompts, n, sampling, rows)

    def grammar(self, sampling: SamplingParams, prompts: list[list[int]], n: int) -> RowGrammars | None:
        """The grammar state of the n rows per prompt of a request asking for structured output
        (None: it does not); StructuredOutputRefused, in one line, for one that cannot be served."""
        spec = sampling.structured_output
        if spec is None:
            return None
        refuse_grammar_conflicts(sampling)
        if self._grammars is None:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._grammars = Grammars(self.tokenizer, vocab, self.eos_token_ids)
        return self._grammars.rows(spec, prompts, n)

    def completions(self, prompts: list[list[int]], n: int, sampling: SamplingParams, rows: DecodedRows) -> list[Completion]:
        """The Completions of decoded rows (row r: prompt r // n)."""
        routed = rows.routed_experts or [b""] * len(rows.tokens)
        top = rows.top_logprobs or [[] for _ in rows.tokens]
        return [
            Completion(
                prompt_token_ids=list(prompts[row // n]),
                token_ids=tokens,
                logprobs=logprobs,
                finish_reason=finish,
                text=response_text(self.tokenizer, tokens, sampling.stop),
                routed_experts=experts,
                prompt_logprobs=list(rows.prompt_logprobs[row // n]) if rows.prompt_logprobs else [],
                top_logprobs=top[row],
            )
            for row, (tokens, logprobs, finish, experts) in enumerate(
                zip(rows.tokens, rows.logprobs, rows.finish_reasons, routed, strict=True)
            )
        ]

    def continuous_batch(self) -> HFBatch | None:
        """A running batch requests join and leave at token boundaries (hf_running.py), in the
        static cache's slots where the engine decodes over one (hf_static_batch.py); None for a
        model with sliding window (or chunked) attention layers, whose caches are not laid side by
        side."""
        if self._static is None and not full_attention(DynamicCache(config=self.model.config)):
            return None
        return HFBatch(self)

    # ------------------------------------------------------------------------------------------
    # weights

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """The model's parameters by HF name: weight sync receives large tensors straight into them
        (the generation gate keeps generation out meanwhile)."""
        return self._weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Copy full tensors into the model in place (tied embeddings stay tied: they share storage).

        Tensors are copied as they arrive, so a bad entry leaves earlier ones loaded; the caller
        treats the error as fatal for this sync and the version is not advanced. An adapter-only
        sync's entries are merged into the base weights first (weights/adapter.py).
        """
        state = self._weights
        with torch.no_grad():
            for name, tensor in merge_adapters(weights, self._adapter_bases):
                if name not in state:
                    raise ValueError(f"load_weights: '{name}' is not a parameter of the rollout model")
                target = state[name]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"load_weights: '{name}' has shape {tuple(tensor.shape)}, the rollout model expects "
                        f"{tuple(target.shape)}"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        self.policy_version = policy_version


class HFBatch:
    """HFEngine's continuous batch (base.EngineBatch): requests join its running batch while they
    ask for the same adapter and routing record as the requests running (the adapter's hooks and
    the routing recorder hold for every forward), at most max_batch_size rows in all. The rows are
    in the engine's static cache (CUDA graphs) unless they run an adapter, whose hooks no graph
    holds."""

    def __init__(self, engine: HFEngine):
        self.engine = engine
        self._running: RunningBatch | None = None
        self._key: tuple[str, bool] = ("", False)
        self._context = ExitStack()
        self._requests: dict[Group, tuple[int, list[list[int]], SamplingParams]] = {}
        self._next_id = 0

    @property
    def rows(self) -> int:
        return 0 if self._running is None else self._running.rows

    def admits(self, num_prompts: int, sampling: SamplingParams) -> bool:
        rows = num_prompts * (1 if sampling.temperature == 0 else sampling.n)
        if self._running is None:
            return rows <= self.engine.max_batch_size
        key = (sampling.adapter, sampling.return_routed_experts)
        return key == self._key and self.rows + rows <= self.engine.max_batch_size

    def add(self, prompt_token_ids: list[list[int]], sampling: SamplingParams, on_tokens: TokensOut | None = None) -> int:
        e = self.engine
        check_prompts(prompt_token_ids, sampling.max_tokens, e.max_model_len)
        if self._running is None:
            self._start(sampling)
        assert self._running is not None
        try:
            n = 1 if sampling.temperature == 0 else sampling.n
            if on_tokens is not None and n != sampling.n:  # greedy: each decoded row stands for n samples
                on_tokens = _copied_rows(on_tokens, sampling.n)
            matcher = TextStopStrings(e.tokenizer, sampling.stop) if sampling.stop else None
            row_seeds = None
            if sampling.seed is not None:
                seeds = [prompt_seed(sampling.seed, ids) for ids in prompt_token_ids]
                row_seeds = [s + j for s in seeds for j in range(n)]
            grammar = e.grammar(sampling, prompt_token_ids, n)
            with torch.inference_mode():
                group = self._running.add(
                    [list(p) for p in prompt_token_ids], n, sampling, matcher=matcher, row_seeds=row_seeds,
                    on_tokens=on_tokens, grammar=grammar,
                )  # fmt: skip
        except BaseException:
            if self._running.rows == 0:  # nothing else runs or joins: the batch ends
                self._close()
            raise
        self._next_id += 1
        self._requests[group] = (self._next_id, group.prompts, sampling)
        return self._next_id

    def step(self) -> dict[int, list[list[Completion]] | Exception]:
        """One step; a request whose grammar found no way on ends alone, with its error; on any other
        error the batch ends (its requests all fail: the caller's to say)."""
        assert self._running is not None, "step: no request is running"
        try:
            with torch.inference_mode():
                finished = self._running.step()
            out: dict[int, list[list[Completion]] | Exception] = {}
            for group in finished:
                request, prompts, sampling = self._requests.pop(group)
                if group.error is not None:  # this request's own failure: the others go on
                    out[request] = group.error
                    continue
                flat = self.engine.completions(prompts, group.n, sampling, group.decoded())
                per_prompt = [flat[i * group.n : (i + 1) * group.n] for i in range(len(prompts))]
                if group.n != sampling.n:  # greedy: decoded once, copied
                    per_prompt = [[copy_completion(c) for _ in range(sampling.n)] for (c,) in per_prompt]
                out[request] = per_prompt
        except BaseException:
            self._close()
            raise
        if self._running.rows == 0:
            self._close()
        return out

    def _start(self, sampling: SamplingParams) -> None:
        """A new running batch under `sampling`'s adapter, recording routes if it asks."""
        e = self.engine
        assert e.adapters is not None  # built with the engine
        self._context = ExitStack()
        try:
            self._context.enter_context(e.adapters.active(sampling.adapter))
            recorder = moe_routing.RoutingRecorder(e.model) if sampling.return_routed_experts else None
        except BaseException:
            self._context.close()
            raise
        kv, sync_every = None, 1  # transformers' dynamic cache, eager: nothing to run ahead
        if e._static is not None and not sampling.adapter:
            kv, sync_every = StaticRows(e._static, record=recorder is not None), CHECK_EVERY
        self._running = RunningBatch(
            e.model, eos_token_ids=e.eos_token_ids, pad_token_id=e.pad_token_id, interrupt=e.interrupt,
            routing=recorder, kv=kv, sync_every=sync_every,
        )  # fmt: skip
        self._key = (sampling.adapter, sampling.return_routed_experts)

    def _close(self) -> None:
        self._running = None
        self._requests.clear()
        self._context.close()
        if self.engine._static is not None:  # an ended batch (or a failed one) holds no state
            self.engine._static.held = None


def _copied_rows(on_tokens: TokensOut, n: int) -> TokensOut:
    """`on_tokens` of a greedy request's n samples, fed the one row decoded for each prompt."""

    def each_sample(rows: list[int], tokens: list[int]) -> None:
        on_tokens([r * n + j for r in rows for j in range(n)], [t for t in tokens for _ in range(n)])

    return each_sample
