"""The embedded engine: HF transformers `generate` in the calling process.

It is the default because it needs nothing beyond transformers, loads in a second and takes new
weights by an in-place copy, which is what colocated and CPU runs want. Log-probs are computed
from the raw logits under temperature only, the distribution the trainer recomputes, so that the
importance ratio at step 0 is exactly 1 whatever top-k/top-p/min-p/repetition penalty did to the
sampler.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteriaList
from transformers.generation.stopping_criteria import StoppingCriteria, StopStringCriteria

from ...core.types import Completion, SamplingParams
from .base import RolloutEngine, copy_completion, stop_token_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _ResponseStopStrings(StoppingCriteria):
    """HF's stop-string matcher restricted to the response, recording where each row first stopped.

    Restricting to the response keeps a prompt that ends like a stop string from ending generation
    before it starts (vLLM also matches the output only). The recorded step is where the row's
    response ends: after it HF fills the row with padding.
    """

    def __init__(self, matcher: StopStringCriteria, prompt_len: int, num_rows: int, device: torch.device):
        self.matcher = matcher
        self.prompt_len = prompt_len
        self.first_stop = torch.full((num_rows,), -1, dtype=torch.long, device=device)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        is_done = self.matcher(input_ids[:, self.prompt_len :], scores)
        step = input_ids.shape[1] - self.prompt_len - 1
        self.first_stop[is_done & (self.first_stop < 0)] = step
        return is_done


class HFEngine(RolloutEngine):
    """A causal LM served by `model.generate` with KV cache, in batches of `max_batch_size` sequences."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_model_len: int = 1024,
        max_batch_size: int = 256,
    ):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got '{dtype}'")
        self.device = torch.device(device)
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
        self.model = model.to(self.device)
        self.model.eval()
        eos_ids = stop_token_ids(self.model.generation_config.eos_token_id, self.tokenizer, model_path)
        self.eos_token_ids = eos_ids
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = eos_ids[0] if pad is None else pad
        # Sampling comes from SamplingParams only: a blank config keeps the checkpoint's
        # generation_config.json (top_k=20, temperature=0.6, ...) out of every generate call.
        self.model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=self.pad_token_id)
        self.policy_version = 0

    # ------------------------------------------------------------------------------------------
    # generation

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        for i, ids in enumerate(prompt_token_ids):
            if len(ids) + sampling.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i}: {len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed "
                    f"max_model_len {self.max_model_len}; shorten the prompt or lower max_tokens"
                )
        # Greedy samples are all equal (and HF refuses num_return_sequences > 1 without sampling):
        # decode once per prompt and copy.
        n = 1 if sampling.temperature == 0 else sampling.n
        matcher = StopStringCriteria(self.tokenizer, sampling.stop) if sampling.stop else None
        out: list[list[Completion]] = [[] for _ in prompt_token_ids]
        with torch.random.fork_rng(**self._rng_devices(), enabled=sampling.seed is not None):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for indices, count in self._plan_chunks(len(prompt_token_ids), n):
                chunk = [prompt_token_ids[i] for i in indices]
                completions = self._generate_chunk(chunk, count, sampling, matcher)
                for j, i in enumerate(indices):
                    out[i].extend(completions[j * count : (j + 1) * count])
        if n != sampling.n:
            out = [[copy_completion(c) for _ in range(sampling.n)] for (c,) in out]
        return out

    def _rng_devices(self) -> dict:
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            return {"devices": [index], "device_type": "cuda"}
        return {"devices": []}

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
    ) -> list[Completion]:
        """Generate n completions for each prompt in one left-padded batch."""
        prompt_len = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), prompt_len), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), prompt_len), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, prompt_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, prompt_len - len(ids) :] = 1
        stop_criteria = StoppingCriteriaList()
        if matcher is not None:
            stop_criteria.append(_ResponseStopStrings(matcher, prompt_len, len(prompts) * n, self.device))
        greedy = sampling.temperature == 0
        gen = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            do_sample=not greedy,
            # Greedy ignores the sampler knobs; None keeps HF from warning that they are set.
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else (0 if sampling.top_k == -1 else sampling.top_k),
            min_p=None if greedy or sampling.min_p == 0 else sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            max_new_tokens=sampling.max_tokens,
            min_new_tokens=None,
            num_return_sequences=n,
            num_beams=1,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            stopping_criteria=stop_criteria,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new_tokens_RT = gen.sequences[:, prompt_len:]
        # One step at a time: stacking the logits would hold rows x steps x vocab floats twice.
        logprobs_RT = torch.stack(
            [
                self._token_logprobs(logits, new_tokens_RT[:, t], sampling.temperature)
                for t, logits in enumerate(gen.logits)
            ],
            dim=1,
        ).cpu()
        new_tokens_RT = new_tokens_RT.cpu()
        first_stop = stop_criteria[0].first_stop.cpu() if matcher is not None else None
        completions = []
        for row in range(new_tokens_RT.shape[0]):
            prompt = prompts[row // n]
            tokens = new_tokens_RT[row].tolist()
            end, finish = len(tokens), "length"
            for t, tok in enumerate(tokens):
                if tok in self.eos_token_ids:
                    end, finish = t + 1, "stop"
                    break
            if first_stop is not None and 0 <= int(first_stop[row]) < end:
                end, finish = int(first_stop[row]) + 1, "stop"
            completions.append(
                Completion(
                    prompt_token_ids=list(prompt),
                    token_ids=tokens[:end],
                    logprobs=logprobs_RT[row, :end].tolist(),
                    finish_reason=finish,
                    text=self._decode(tokens[:end], sampling.stop),
                )
            )
        return completions

    @staticmethod
    def _token_logprobs(logits_RV: torch.Tensor, tokens_R: torch.Tensor, temperature: float) -> torch.Tensor:
        logits_RV = logits_RV.float()
        if temperature > 0:
            logits_RV = logits_RV / temperature
        return torch.log_softmax(logits_RV, dim=-1).gather(-1, tokens_R[:, None]).squeeze(-1)

    def _decode(self, token_ids: list[int], stop: list[str]) -> str:
        text = str(self.tokenizer.decode(token_ids, skip_special_tokens=True))
        cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
        return text[: min(cuts)] if cuts else text

    # ------------------------------------------------------------------------------------------
    # weights

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """The model's parameters by HF name: weight sync receives large tensors straight into them
        (the generation gate keeps generation out meanwhile)."""
        return self.model.state_dict()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Copy full tensors into the model in place (tied embeddings stay tied: they share storage).

        Tensors are copied as they arrive, so a bad entry leaves earlier ones loaded; the caller
        treats the error as fatal for this sync and the version is not advanced.
        """
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
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
