"""Tasksets read through HF `datasets` and served in seeded, resumable batches."""

from __future__ import annotations

import os
import random
from typing import Any

from ..config.schema import FormatConfig, RLCoreConfig, TasksetConfig
from ..registry import import_path
from ..types import Task
from .taskset_check import messages_problem, response_text

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def tasksets_of(cfg: RLCoreConfig) -> list[tuple[str, TasksetConfig]]:
    """(config key, taskset) of a stage's training, evaluation and expert tasksets."""
    ins = cfg.buffer.explorer_input
    expert = cfg.buffer.expert_taskset
    return (
        [("buffer.explorer_input.taskset", ins.taskset)]
        + [(f"buffer.explorer_input.eval_tasksets[{i}]", t) for i, t in enumerate(ins.eval_tasksets)]
        + ([("buffer.expert_taskset", expert)] if expert is not None else [])
    )


def ensure_taskset(cfg: TasksetConfig, key_path: str) -> None:
    """Run the configured generator when the taskset file is missing."""
    if cfg.generator is None or os.path.exists(cfg.path):
        return
    from . import GENERATORS

    fn = (
        GENERATORS.resolve(cfg.generator)
        if cfg.generator in GENERATORS
        else import_path(cfg.generator, f"{key_path}.generator")
    )
    try:
        fn(cfg.path, **cfg.generator_args)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{key_path}.generator_args: {e}") from None


def load_tasks(cfg: TasksetConfig, key_path: str) -> list[Task]:
    """Read every row of the taskset into Tasks (prompt/answer/response by the format keys)."""
    from datasets import load_dataset

    path = cfg.path
    if os.path.isdir(path):
        ds = load_dataset(path, split=cfg.split)
    else:
        ext = os.path.splitext(path)[1].lower()
        if ext not in FORMATS:
            raise ValueError(
                f"{key_path}.path: unsupported file type '{ext}'; use one of {', '.join(FORMATS)}"
            )
        ds = load_dataset(FORMATS[ext], data_files={cfg.split: path}, split=cfg.split)
    fmt = cfg.format
    if fmt.prompt_type == "messages":
        return _message_tasks(cfg, key_path, ds)
    if fmt.prompt_key not in ds.column_names:
        raise ValueError(
            f"{key_path}.format.prompt_key: column '{fmt.prompt_key}' not in {path}; columns: {', '.join(ds.column_names)}"
        )
    if cfg.num_samples is not None:
        ds = ds.select(range(min(cfg.num_samples, len(ds))))
    tasks = []
    for i, row in enumerate(ds):
        answer = row.get(fmt.answer_key)
        response = row.get(fmt.response_key)
        if row[fmt.prompt_key] is None:
            raise ValueError(f"{key_path}: {path} row {i + 1}: the prompt ('{fmt.prompt_key}') is null")
        tasks.append(
            Task(
                task_id=f"{cfg.name}-{i}",
                prompt=str(row[fmt.prompt_key]),
                answer=None if answer is None else str(answer),
                response=None if response is None else str(response),
                metadata={
                    k: v
                    for k, v in row.items()
                    if k not in (fmt.prompt_key, fmt.answer_key, fmt.response_key)
                },
            )
        )
    if not tasks:
        raise ValueError(f"{key_path}.path: '{path}' has no rows")
    return tasks


def _message_tasks(cfg: TasksetConfig, key_path: str, ds: Any) -> list[Task]:
    """Tasks of a messages taskset: the conversation in `metadata["messages"]`, the prompt its
    last user turn (what reward functions and logs read)."""
    fmt = cfg.format
    if fmt.messages_key not in ds.column_names:
        raise ValueError(
            f"{key_path}.format.messages_key: column '{fmt.messages_key}' not in {cfg.path}; "
            f"columns: {', '.join(ds.column_names)}"
        )
    if cfg.num_samples is not None:
        ds = ds.select(range(min(cfg.num_samples, len(ds))))
    tasks = []
    for i, row in enumerate(ds):
        messages = row[fmt.messages_key]
        problem = messages_problem(messages, needs_assistant=False)
        if problem is not None:
            raise ValueError(
                f"{key_path}: {cfg.path} row {i + 1}: the messages ('{fmt.messages_key}') {problem}"
            )
        messages = [{k: v for k, v in m.items() if v is not None or k == "content"} for m in messages]
        users = [m["content"] for m in messages if m["role"] == "user"]
        answer = row.get(fmt.answer_key)
        tasks.append(
            Task(
                task_id=f"{cfg.name}-{i}",
                prompt=str(users[-1]) if users else "",
                answer=None if answer is None else str(answer),
                metadata={
                    "messages": messages,
                    **{k: v for k, v in row.items() if k not in (fmt.messages_key, fmt.answer_key)},
                },
            )
        )
    if not tasks:
        raise ValueError(f"{key_path}.path: '{cfg.path}' has no rows")
    return tasks


def preference_pair(task: Task, fmt: FormatConfig, key_path: str) -> tuple[str, str]:
    """(chosen, rejected) response texts of a DPO row (text, or chat messages' assistant turns)."""
    texts = []
    for what, column in (("chosen", fmt.chosen_key), ("rejected", fmt.rejected_key)):
        text = response_text(task.metadata.get(column))
        if text is None:
            raise ValueError(
                f"{key_path}.format.{what}_key: task {task.task_id} has no {what} response in column '{column}' "
                "(DPO trains on a chosen and a rejected response per row, text or chat messages)"
            )
        texts.append(text)
    return texts[0], texts[1]


class TaskStream:
    """Batches of `batch_size` tasks; epoch e is the taskset shuffled with seed (seed, e).

    The position is just the number of batches consumed, so resuming needs only that number.
    Incomplete trailing batches are dropped so every step has the same shape.
    """

    def __init__(self, tasks: list[Task], batch_size: int, seed: int, shuffle: bool):
        if len(tasks) < batch_size:
            raise ValueError(
                f"the taskset has {len(tasks)} rows, fewer than buffer.batch_size ({batch_size})"
            )
        self.tasks = tasks
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.batches_per_epoch = len(tasks) // batch_size

    def batch(self, index: int) -> list[Task]:
        epoch, i = divmod(index, self.batches_per_epoch)
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        picked = order[i * self.batch_size : (i + 1) * self.batch_size]
        return [self.tasks[j] for j in picked]

    def extra(self, index: int, round_: int) -> list[Task]:
        """Round `round_` (1, 2, ...) of extra tasks for batch `index` (dynamic sampling): batch_size
        distinct tasks drawn from the whole taskset, the same ones whenever asked again."""
        rng = random.Random((self.seed * 1_000_003 + index) * 1_009 + round_)
        return [self.tasks[j] for j in rng.sample(range(len(self.tasks)), self.batch_size)]
