"""The `reward_model` reward: a reward model scores each prompt and response.

List `reward_model` in a taskset's `reward_fn` and set its `reward_model` block: `path`, a folder that
transformers' AutoModelForSequenceClassification loads with one label (an algorithm_type
reward_model stage's export, or 'stage:<name>' for that stage of the same run), and `normalize`.
It runs where the workflow runs (the rollout worker, or the trainer's process for in-process
engines), on the GPU when there is one, as a batch reward: a workflow's responses are scored
`batch_size` at a time.

A response is scored as the reward_model stage trained on it: the prompt as the policy's stage
renders it (its chat template and the taskset's system prompt), then the response's tokens and the
end-of-text token, read at that last token (core/algorithms/reward_model.py). What it does not see:
a row's own system prompt or tools (format.system_prompt_key, tools_key), a messages row's
conversation (its prompt text only), and, with format.reasoning_tags, the reasoning block (it
scores the answer after it, as every reward function does); a response the token budget cut off
is scored as if it had ended. The model is held in float32, once per process (on a rollout worker
beside its engine: on the GPU, count it against the engine's memory).

transformers' own AutoModelForSequenceClassification reads a row at its last token that is not the
pad token: the same score, except for a tokenizer whose pad token is its end-of-text token (Qwen's
base models), where it reads the token before; this scorer reads the last token itself.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from ...core.config.stage_refs import STAGE_PREFIX

REWARD_MODEL = "reward_model"
"""Its name in reward_fn."""

KEYS = ("path", "normalize", "batch_size")
NORMALIZE = ("none", "sigmoid")


def reward_model_settings(cfg: Any) -> dict[str, Any]:
    """A taskset's `reward_model` block (RewardModelRewardConfig) as the plain dict that travels in
    WorkflowSpec."""
    return {"path": cfg.path, "normalize": cfg.normalize, "batch_size": int(cfg.batch_size)}


def check_reward_model(settings: dict[str, Any], check_path: bool = True) -> None:
    """ValueError naming `reward_model.<field>` for settings that cannot work; `check_path`: the
    folder must hold a model's config here (not for 'stage:<name>', which the run writes)."""
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise ValueError(f"reward_model: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    path = settings.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError(
            "reward_model.path: give the reward model's folder (AutoModelForSequenceClassification, one label), "
            "e.g. a reward_model stage's export, or 'stage:<name>' for that stage of this run"
        )
    if check_path and not path.startswith(STAGE_PREFIX) and not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"reward_model.path: '{path}' is not a model folder (no config.json there)")
    if settings.get("normalize") not in NORMALIZE:
        raise ValueError(f"reward_model.normalize must be one of {', '.join(NORMALIZE)}; got {settings.get('normalize')!r}")
    size = settings.get("batch_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"reward_model.batch_size must be an integer >= 1; got {size!r}")


_LOADED: dict[str, tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def _load(path: str) -> tuple[Any, Any]:
    """(model, tokenizer) of `path`, loaded once per process (workflows of one run share it)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with _LOCK:
        if path not in _LOADED:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).to(device).eval()
            if model.config.num_labels != 1:
                raise ValueError(
                    f"reward_model.path: '{path}' has {model.config.num_labels} labels; a reward model has one score"
                )
            _LOADED[path] = (model, AutoTokenizer.from_pretrained(path))
        return _LOADED[path]


class RewardModelScorer:
    """The `reward_model` reward of one taskset: a batch reward (it takes `completions`)."""

    def __init__(self, settings: dict[str, Any], prompt_format: Any):
        """`prompt_format`: how the policy's stage renders a prompt (core/data/prompts.PromptFormat)."""
        check_reward_model(settings, check_path=False)
        if settings["path"].startswith(STAGE_PREFIX):
            raise ValueError(
                f"reward_model.path: '{settings['path']}' names a stage, which the run resolves to its export "
                "before the stage explores; outside a run give the folder itself"
            )
        self.settings, self.prompt_format = settings, prompt_format

    def encode(self, tokenizer: Any, prompt: str, completion: str) -> list[int]:
        response = tokenizer(completion, add_special_tokens=False)["input_ids"]
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        return self.prompt_format.encode_prompt(tokenizer, prompt) + response + eos

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """Each (prompt, completion)'s raw score: the head at its last token."""
        import torch

        model, tokenizer = _load(self.settings["path"])
        rows = [self.encode(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
        out: list[float] = []
        size = self.settings["batch_size"]
        device = next(model.parameters()).device
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            width = max(len(r) for r in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(chunk):
                ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
            with torch.no_grad():
                hidden = model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
                last = hidden[torch.arange(len(chunk)), mask.sum(1).to(device) - 1]
                out += model.score(last)[:, 0].float().tolist()
        return out

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], task_id: Sequence[str]) -> list[float]:
        raw = self.scores(prompts, completions)
        if self.settings["normalize"] == "sigmoid":
            return [1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v)) for v in raw]
        return raw
