"""The expert demonstrations of algorithm_type mix, as every trainer rank holds them: the rows of
buffer.expert_taskset in seeded batches (batch k of a stage is the same on every rank and after a
resume), encoded as SFT encodes its rows (core/data/prompts.py), so the expert part of a mixed step
trains on exactly what an SFT stage would."""

from __future__ import annotations

from typing import Any

from ..core.algorithms.mix import expert_rows_per_step
from ..core.batch import Sequence
from ..core.config import RLCoreConfig
from ..core.data.prompts import PromptFormat, model_chat_template
from ..core.data.taskset import TaskStream, load_tasks

KEY = "buffer.expert_taskset"


class ExpertRows:
    def __init__(self, cfg: RLCoreConfig, tokenizer: Any, rollouts_per_step: int):
        ts = cfg.buffer.expert_taskset
        assert ts is not None, "config validation asks mix for buffer.expert_taskset"
        self.per_step = expert_rows_per_step(rollouts_per_step, cfg.algorithm.mix_expert_ratio)
        tasks = load_tasks(ts, KEY)
        if len(tasks) < self.per_step:
            raise ValueError(
                f"{KEY}: {len(tasks)} rows, but each step takes {self.per_step} (algorithm.mix_expert_ratio "
                f"{cfg.algorithm.mix_expert_ratio} of a train batch with {rollouts_per_step} rollouts): give "
                "more rows or a lower mix_expert_ratio"
            )
        self.stream = TaskStream(tasks, self.per_step, cfg.seed, ts.shuffle)
        self.format = PromptFormat(
            cfg.model.max_prompt_tokens, cfg.model.apply_chat_template, model_chat_template(cfg.model),
            ts.format.system_prompt,
        )  # fmt: skip
        self.tokenizer, self.response_key = tokenizer, ts.format.response_key

    def sequences(self, step: int, first_index: int) -> list[Sequence]:
        """Batch `step` of the expert rows, indexed from `first_index` on (after the rollouts)."""
        out = []
        for j, t in enumerate(self.stream.batch(step)):
            if t.response is None:
                raise ValueError(f"{KEY}: task {t.task_id} has no response (column '{self.response_key}')")
            prompt, response = self.format.encode_sft_example(self.tokenizer, t.prompt, t.response)
            out.append(Sequence(prompt, response, index=first_index + j))
        return out
