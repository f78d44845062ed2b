"""The sequences an SFT or DPO step trains on (plan.source responses or pairs), from the taskset's
own rows: each row encoded by its taskset's format (a mixture's tasksets keep theirs); or DPO's
pairs an explorer wrote to the experience buffer (algorithm.dpo.pairs buffer: `explored_pairs`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..client.trainer import TrainSequence
from ..core.algorithms.reward_model import pair_metrics
from ..core.config import RLCoreConfig
from ..core.config.plan import StagePlan
from ..core.data.prompts import PromptFormat, model_prompt_format
from ..core.data.taskset import load_tasks, preference_pair, training_tasksets
from ..core.step_metrics import mean_dicts, mixture_metrics
from ..core.types import Experience, Task
from ..rollout.workflows import resolve_workflow

Formats = dict[str, tuple[str, Any, PromptFormat]]
"""Training taskset name -> (its config key, its TasksetConfig, how its rows are encoded)."""


def taskset_formats(cfg: RLCoreConfig, tasksets: list[tuple[str, Any]] | None = None) -> Formats:
    """Each training taskset's format (a mixture's keep theirs), or each of `tasksets` ((config key,
    TasksetConfig) pairs): how SFT, DPO and a reward model encode its rows."""
    return {
        t.name: (key, t, model_prompt_format(
            cfg.model, t.format.system_prompt,
            # an SFT stage renders its conversations with the tools its taskset's workflow declares
            resolve_workflow(t.default_workflow_type).tool_schemas(dict(t.workflow_args)),
        ))
        for key, t in (training_tasksets(cfg) if tasksets is None else tasksets)
    }  # fmt: skip


def row_sequences(
    tasks: list[Task], formats: Formats, default: str, tokenizer: Any, pairs: bool, margin_key: str | None = None
) -> list[list[TrainSequence]]:
    """Each task's sequences. SFT: its reference response, or its chat conversation's samples (one
    unless a thinking template renders its history anew, prompts.py); DPO or a reward model
    (`pairs`): its (chosen, rejected) pair, one after the other, the chosen one's advantage the pair's
    margin when `margin_key` names its column (algorithm.reward_model.margin_key). A task of no
    training taskset's name is encoded by the `default` one's format."""
    out = []
    for t in tasks:
        seqs: list[TrainSequence] = []
        out.append(seqs)
        key, ts, prompt_format = formats.get(t.source) or formats[default]
        fmt = ts.format
        prompt_format = prompt_format.for_task(t)  # its row's own system prompt and tools
        if pairs:
            responses = list(preference_pair(t, fmt, key))
        elif "messages" in t.metadata and fmt.prompt_type == "messages":
            for prompt_ids, response_ids, mask in prompt_format.encode_sft_messages(tokenizer, t.metadata["messages"]):
                seqs.append(TrainSequence(prompt_ids, response_ids, loss_mask=[float(m) for m in mask]))
            continue
        elif t.response is None:
            raise ValueError(f"SFT needs a reference response: task {t.task_id} has no column '{fmt.response_key}'")
        else:
            responses = [t.response]
        for response in responses:
            prompt_ids, response_ids = prompt_format.encode_sft_example(tokenizer, t.prompt, response)
            seqs.append(TrainSequence(prompt_ids, response_ids))
        if pairs and margin_key is not None:
            seqs[0].advantages = [pair_margin(t, margin_key)]
    return out


def pair_margin(task: Task, margin_key: str) -> float:
    """A pair's margin from its row's column `margin_key` (a number)."""
    value = task.metadata.get(margin_key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(
            f"algorithm.reward_model.margin_key: task {task.task_id} has no numeric margin in column "
            f"'{margin_key}' (got {value!r}); give every row a number, or unset the key"
        )
    return float(value)


def explored_pairs(exps: list[Experience]) -> list[TrainSequence]:
    """DPO's sequences from the experience buffer's pairs (algorithm.dpo.pairs buffer): each group an
    explorer wrote is [chosen, rejected] of one task (dpo.best_and_worst), trained as it was sampled."""
    if len(exps) % 2 or any(
        a.group_id != b.group_id or a.reward <= b.reward for a, b in zip(exps[::2], exps[1::2], strict=True)
    ):
        groups = sorted({e.group_id for e in exps})
        raise ValueError(
            f"the experience buffer holds groups that are not (chosen, rejected) pairs ({len(exps)} experiences in "
            f"{len(groups)} groups): algorithm.dpo.pairs buffer trains on what an explorer of the same config "
            "writes; point buffer.trainer_input.experience_buffer at a new buffer for it"
        )
    return [TrainSequence(e.prompt_token_ids, e.response_token_ids, [float(m) for m in e.loss_mask]) for e in exps]


def mixture_report(tasks: list[Task], formats: Formats) -> Callable[[list[Experience]], dict[str, float]]:
    """A step's per-taskset metrics (rewards and counts) when several tasksets train, else none."""
    source_of = {t.task_id: t.source for t in tasks}
    if len(formats) < 2:
        return lambda exps: {}
    return lambda exps: mixture_metrics(exps, source_of, formats)


class RowsSource:
    """SFT on the tasks' reference responses, or DPO on their (chosen, rejected) pairs (plan.source
    responses or pairs): one optimizer step per train batch of tasks, through the trainer handle."""

    def __init__(
        self, cfg: RLCoreConfig, plan: StagePlan, handle: Any, formats: Formats, tokenizer: Any, train_batch: int
    ):  # fmt: skip
        self.handle, self.formats, self.tokenizer = handle, formats, tokenizer
        self.pairs, reward = plan.trains_on == "pairs", plan.trained_model == "reward"
        self.default = cfg.buffer.explorer_input.taskset.name
        self.per_update = train_batch  # tasks: a pair's two sequences, a conversation's samples stay together
        self.loss = "bradley_terry" if reward else "dpo" if self.pairs else "cross_entropy"
        self.margin_key = cfg.algorithm.reward_model.margin_key if reward else None

    def step(self, tasks: list[Task], global_step: int) -> tuple[dict[str, float], int]:
        """The step's metrics and the trainer's global step after it."""
        per_task = row_sequences(tasks, self.formats, self.default, self.tokenizer, self.pairs, self.margin_key)
        return self.train(per_task, global_step)

    def train(self, per_task: list[list[TrainSequence]], global_step: int) -> tuple[dict[str, float], int]:
        """A step on each task's sequences (a DPO pair's two one after the other), train_batch
        tasks an update: its metrics and the trainer's global step after it."""
        updates = []
        for i in range(0, len(per_task), self.per_update):
            chunk = [s for seqs in per_task[i : i + self.per_update] for s in seqs]
            result = self.handle.forward_backward(chunk, self.loss)
            step = self.handle.optim_step()
            updates.append({**result.metrics, "actor/grad_norm": step.grad_norm, "actor/lr": step.lr})
            global_step = step.global_step
        metrics = mean_dicts(updates)
        metrics["perf/tokens"] = float(
            sum(len(s.prompt_token_ids) + len(s.response_token_ids) for seqs in per_task for s in seqs)
        )
        return metrics, global_step


class PairEvaluation:
    """A reward model's held-out evaluation (plan.trained_model reward): on each eval taskset's
    (chosen, rejected) rows, scored by the trainer, its pair accuracy, mean margin and loss
    (eval/<taskset>/pair_accuracy, margin, loss, pairs)."""

    def __init__(self, cfg: RLCoreConfig, handle: Any, tokenizer: Any):
        self.handle = handle
        self.sets: list[tuple[str, list[TrainSequence]]] = []
        for i, ts in enumerate(cfg.buffer.explorer_input.eval_tasksets):
            key = f"buffer.explorer_input.eval_tasksets[{i}]"
            formats = taskset_formats(cfg, [(key, ts)])
            per_task = row_sequences(load_tasks(ts, key), formats, ts.name, tokenizer, pairs=True)
            self.sets.append((ts.name, [s for seqs in per_task for s in seqs]))

    def evaluate(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, seqs in self.sets:
            scores = [values[0] for values in self.handle.compute_logprobs(seqs)]
            metrics.update(pair_metrics(scores, f"eval/{name}/"))
        return metrics
