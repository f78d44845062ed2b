"""Prompts longer than model.max_prompt_tokens, counted before anything starts: they are cut from
the left at run time, so a launch (and `rlcore config validate`, when the tokenizer is on disk)
warns with their number, or refuses the first one when model.enable_prompt_truncation is false."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..config import ConfigError, Stage, inherits_previous_model
from .prompts import PromptFormat, model_prompt_format
from .taskset import load_tasks, tasksets_of

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(model_path: str) -> bool:
    return any(os.path.isfile(os.path.join(model_path, f)) for f in TOKENIZER_FILES)


def load_tokenizer(path: str) -> Any:
    """The tokenizer at `path` to count prompt tokens with. A folder with a `tokenizer.json` loads as
    a fast tokenizer from it, without transformers' auto classes, which import torch and every model
    config (seconds of a launch before anything runs, and as many of `config validate`): the same
    vocabulary, merges, special tokens and chat template, so both count alike."""
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer  # heavy: only once a tokenizer is there to load

    return AutoTokenizer.from_pretrained(path)


def prompt_token_counts(tokenizer: Any, fmt: PromptFormat, tasks: list[Any]) -> list[int]:
    """Each task's prompt tokens before truncation (PromptFormat.encode_whole_prompt's count), its
    distinct texts encoded in one batch (tasksets repeat prompts; one call per prompt cost seconds)."""
    texts = [fmt.for_task(t).prompt_text(tokenizer, t.prompt, t.metadata.get("messages")) for t in tasks]
    distinct = list(dict.fromkeys(texts))
    if not distinct:
        return []
    counts = dict(zip(distinct, map(len, tokenizer(distinct, add_special_tokens=False)["input_ids"]), strict=True))
    return [counts[text] for text in texts]


def check_prompt_lengths(stages: list[Stage], only_on_disk: bool = False) -> bool:
    """Count each taskset's over-long prompts and warn on stderr; with enable_prompt_truncation
    false, raise ConfigError naming the first (file and row). `only_on_disk`: skip the stages
    whose tokenizer is not on disk yet (a launch downloads or builds it). Whether every stage
    was checked."""
    checked_all, tokenizer_dir, tokenizer = True, None, None
    for s in stages:
        cfg, prefix = s.config, ("" if len(stages) == 1 else f"stages[{s.index}].")
        if tokenizer_dir is None or not inherits_previous_model(
            cfg
        ):  # an inherited model keeps its tokenizer
            if cfg.model.model_path != tokenizer_dir:
                tokenizer_dir, tokenizer = cfg.model.model_path, None
                if not only_on_disk or has_tokenizer(tokenizer_dir):
                    tokenizer = load_tokenizer(tokenizer_dir)
        if tokenizer is None:
            checked_all = False
            continue
        limit = cfg.model.max_prompt_tokens
        for key, ts in tasksets_of(cfg):
            fmt = model_prompt_format(cfg.model, ts.format.system_prompt)
            if only_on_disk and not os.path.exists(ts.path):  # a generator writes it at launch
                checked_all = False
                continue
            tasks = load_tasks(ts, key)
            lengths = prompt_token_counts(tokenizer, fmt, tasks)
            long = [i for i, n in enumerate(lengths) if n > limit]
            if not long:
                continue
            if not cfg.model.enable_prompt_truncation:
                raise ConfigError(
                    f"{prefix}{key}: {ts.path} row {long[0] + 1}'s prompt is {lengths[long[0]]} tokens, more than "
                    f"model.max_prompt_tokens ({limit}), and model.enable_prompt_truncation is false: raise the "
                    f"limit, shorten the prompt, or allow truncation ({len(long)} of {len(tasks)} prompts are longer)"
                )
            print(
                f"rlcore: warning: {len(long)} of {len(tasks)} prompts of {prefix}{key} ({ts.path}) are longer than "
                f"model.max_prompt_tokens ({limit}, the longest {max(lengths)}): their beginnings are cut off",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    return checked_all
