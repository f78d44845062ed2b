"""Tasksets read through HF `datasets` and served in seeded, resumable batches."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from typing import Any

from ..config.schema import FormatConfig, RLCoreConfig, TasksetConfig
from ..registry import import_path
from ..types import Task
from .dataset_files import load_dataset_of
from .task_selection import SelectingStream, TaskSelection, selects
from .taskset_check import messages_problem, own_columns, response_text, tools_problem, value_of


def tasksets_of(cfg: RLCoreConfig) -> list[tuple[str, TasksetConfig]]:
    """(config key, taskset) of a stage's training, evaluation and expert tasksets."""
    ins = cfg.buffer.explorer_input
    expert = cfg.buffer.expert_taskset
    return (
        [("buffer.explorer_input.taskset", ins.taskset)]
        + [(f"buffer.explorer_input.mixture[{i}]", t) for i, t in enumerate(ins.mixture)]
        + [(f"buffer.explorer_input.eval_tasksets[{i}]", t) for i, t in enumerate(ins.eval_tasksets)]
        + ([("buffer.expert_taskset", expert)] if expert is not None else [])
    )


def training_tasksets(cfg: RLCoreConfig) -> list[tuple[str, TasksetConfig]]:
    """(config key, taskset) of what a stage trains on: the taskset, then its mixture's."""
    ins = cfg.buffer.explorer_input
    return [("buffer.explorer_input.taskset", ins.taskset)] + [
        (f"buffer.explorer_input.mixture[{i}]", t) for i, t in enumerate(ins.mixture)
    ]


def mixture_counts(batch_size: int, weights: list[float]) -> list[int]:
    """Each taskset's tasks per batch: batch_size split by weight, the remainders going to the
    largest fractions (ties to the earlier taskset)."""
    total = sum(weights)
    exact = [batch_size * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))[: batch_size - sum(counts)]:
        counts[i] += 1
    return counts


def task_stream(cfg: RLCoreConfig) -> TaskStream | SelectingStream | MixtureStream:
    """The stage's training batches: of its taskset, or of its mixture (one stream per taskset)."""
    sets = training_tasksets(cfg)
    chooser = cfg.buffer.explorer_input.task_selection
    selection = TaskSelection(chooser, "buffer.explorer_input.task_selection") if selects(chooser) else None

    def stream(ordered: TaskStream, key: str) -> TaskStream | SelectingStream:
        if selection is None:
            return ordered
        selection.check_column(ordered.tasks, key)
        return SelectingStream(ordered, selection)

    if len(sets) == 1:
        key, ts = sets[0]
        return stream(TaskStream(load_tasks(ts, key), cfg.buffer.batch_size, cfg.seed, ts.shuffle), key)
    counts = mixture_counts(cfg.buffer.batch_size, [ts.weight for _, ts in sets])
    streams = []
    for i, ((key, ts), count) in enumerate(zip(sets, counts, strict=True)):
        try:
            ordered = TaskStream(load_tasks(ts, key), count, cfg.seed + i, ts.shuffle)
        except ValueError as e:
            raise ValueError(f"{key}: {e} (its share of each batch, by weight)") from None
        streams.append(stream(ordered, key))
    return MixtureStream(streams)


GENERATED = ".generator.json"
"""Beside a generated taskset (`<path>.generator.json`): the generator and the arguments that wrote it."""


def ensure_taskset(cfg: TasksetConfig, key_path: str) -> None:
    """Run the configured generator when the taskset file is missing, and note what wrote it beside
    it; a file written by other generator arguments is refused in one line (it is not read as if
    the arguments had changed it)."""
    if cfg.generator is None:
        return
    made = {"generator": cfg.generator, "generator_args": json.loads(json.dumps(dict(cfg.generator_args), sort_keys=True))}
    if os.path.exists(cfg.path):
        _check_generated(cfg.path, made, key_path)
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
    if os.path.isfile(cfg.path):
        tmp = f"{cfg.path}{GENERATED}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(made, f, sort_keys=True)
        os.replace(tmp, cfg.path + GENERATED)


def _check_generated(path: str, made: dict[str, Any], key_path: str) -> None:
    """`path` exists: refuse it when the note beside it says other generator arguments wrote it (a
    file without a note, written by hand or by an older rlcore, is taken as it is)."""
    try:
        with open(path + GENERATED) as f:
            wrote = json.load(f)
    except (OSError, ValueError):
        return
    if wrote != made:
        raise ValueError(
            f"{key_path}.path: '{path}' was generated by {wrote.get('generator')} with {wrote.get('generator_args')}, "
            f"not with the generator_args given now ({made['generator_args']}): delete it (and {os.path.basename(path)}"
            f"{GENERATED}) to write it anew, or give another path"
        )


def has_column(columns: list[str], key: str) -> bool:
    """Whether a format key names a column, or a field nested in one (`reward_model.ground_truth`)."""
    return key in columns or key.split(".")[0] in columns


ROWS_PER_BATCH = 1000
"""Rows a taskset's dataset formats at a time (row by row, `datasets` spends ~30 us on each)."""


def rows_of(ds: Any) -> Iterator[dict[str, Any]]:
    """The dataset's rows as dicts, as iterating it gives them, formatted a batch at a time."""
    for batch in ds.iter(batch_size=ROWS_PER_BATCH):
        yield from (dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True))


def load_tasks(cfg: TasksetConfig, key_path: str) -> list[Task]:
    """Read every row of the taskset into Tasks (prompt/answer/response by the format keys)."""
    path = cfg.path
    ds = load_dataset_of(cfg, key_path)
    fmt = cfg.format
    if fmt.prompt_type == "messages":
        return _message_tasks(cfg, key_path, ds)
    if not has_column(ds.column_names, fmt.prompt_key):
        raise ValueError(
            f"{key_path}.format.prompt_key: column '{fmt.prompt_key}' not in {path}; columns: {', '.join(ds.column_names)}"
        )
    if cfg.num_samples is not None:
        ds = ds.select(range(min(cfg.num_samples, len(ds))))
    tasks, own = [], own_columns(fmt)
    for i, row in enumerate(rows_of(ds)):
        answer = value_of(row, fmt.answer_key)
        response = value_of(row, fmt.response_key)
        prompt = value_of(row, fmt.prompt_key)
        if prompt is None:
            raise ValueError(
                f"{key_path}: {path} row {i + 1}: the prompt ('{fmt.prompt_key}') is null or missing"
            )
        tasks.append(
            Task(
                task_id=f"{cfg.name}-{i}",
                source=cfg.name,
                prompt=str(prompt),
                answer=None if answer is None else str(answer),
                response=None if response is None else str(response),
                metadata={
                    **{k: v for k, v in row.items() if k not in own},
                    **_row_tools(row, fmt, key_path, cfg.path, i),
                },
            )
        )
    if not tasks:
        raise ValueError(f"{key_path}.path: '{path}' has no rows")
    return tasks


def _row_tools(row: dict[str, Any], fmt: Any, key_path: str, path: str, i: int) -> dict[str, Any]:
    """The row's own "tools" (its tool schemas, checked) and "system_prompt", those it has."""
    out: dict[str, Any] = {}
    system = row.get(fmt.system_prompt_key)
    if system is not None:
        if not isinstance(system, str):
            raise ValueError(
                f"{key_path}: {path} row {i + 1}: the system prompt ('{fmt.system_prompt_key}') must be text"
            )
        out["system_prompt"] = system
    tools = row.get(fmt.tools_key)
    if tools is None:
        return out
    problem = tools_problem(tools)
    if problem is not None:
        raise ValueError(f"{key_path}: {path} row {i + 1}: the tools ('{fmt.tools_key}') {problem}")
    # datasets fills keys a row lacks with None across a column's structs: drop them again
    return {**out, "tools": [_without_nones(t) for t in tools]}


def _without_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nones(v) for v in value]
    return value


class MixtureStream:
    """Batches made of several TaskStreams' batches, in taskset order (batch k of each): as seeded
    and resumable as theirs."""

    def __init__(self, streams: list[TaskStream | SelectingStream]):
        self.streams = streams
        self.selection = streams[0].selection
        self.tasks = [t for s in streams for t in s.tasks]
        self.batch_size = sum(s.batch_size for s in streams)
        self.batches_per_epoch = max(s.batches_per_epoch for s in streams)

    def batch(self, index: int) -> list[Task]:
        return [t for s in self.streams for t in s.batch(index)]

    def extra(self, index: int, round_: int) -> list[Task]:
        return [t for s in self.streams for t in s.extra(index, round_)]


def _message_tasks(cfg: TasksetConfig, key_path: str, ds: Any) -> list[Task]:
    """Tasks of a messages taskset: the conversation in `metadata["messages"]`, the prompt its
    last user turn (what reward functions and logs read)."""
    fmt = cfg.format
    if not has_column(ds.column_names, fmt.messages_key):
        raise ValueError(
            f"{key_path}.format.messages_key: column '{fmt.messages_key}' not in {cfg.path}; "
            f"columns: {', '.join(ds.column_names)}"
        )
    if cfg.num_samples is not None:
        ds = ds.select(range(min(cfg.num_samples, len(ds))))
    tasks, own = [], own_columns(fmt)
    for i, row in enumerate(rows_of(ds)):
        messages = value_of(row, fmt.messages_key)
        problem = messages_problem(messages, needs_assistant=False)
        if problem is not None:
            raise ValueError(
                f"{key_path}: {cfg.path} row {i + 1}: the messages ('{fmt.messages_key}') {problem}"
            )
        messages = [{k: v for k, v in m.items() if v is not None or k == "content"} for m in messages]
        users = [m["content"] for m in messages if m["role"] == "user"]
        answer = value_of(row, fmt.answer_key)
        tasks.append(
            Task(
                task_id=f"{cfg.name}-{i}",
                source=cfg.name,
                prompt=str(users[-1]) if users else "",
                answer=None if answer is None else str(answer),
                metadata={
                    "messages": messages,
                    **{k: v for k, v in row.items() if k not in own},
                    **_row_tools(row, fmt, key_path, cfg.path, i),
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
        self.selection: Any = None
        """The TaskSelection that chooses the batches (task_selection.SelectingStream); None: the order alone."""

    def order(self, epoch: int) -> list[int]:
        """The tasks' indices in epoch `epoch`'s order."""
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def batch(self, index: int) -> list[Task]:
        epoch, i = divmod(index, self.batches_per_epoch)
        picked = self.order(epoch)[i * self.batch_size : (i + 1) * self.batch_size]
        return [self.tasks[j] for j in picked]

    def extra(self, index: int, round_: int) -> list[Task]:
        """Round `round_` (1, 2, ...) of extra tasks for batch `index` (dynamic sampling): batch_size
        distinct tasks drawn from the whole taskset, the same ones whenever asked again."""
        rng = random.Random((self.seed * 1_000_003 + index) * 1_009 + round_)
        return [self.tasks[j] for j in rng.sample(range(len(self.tasks)), self.batch_size)]
