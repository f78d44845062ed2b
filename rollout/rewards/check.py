"""Reward functions tried before anything starts: each taskset's, built and called once on the
first row of its file, folder or Hub dataset (a generated taskset not written yet: of a throwaway
copy its generator writes), by `rlcore config validate` and by every launch. A user function with
the wrong signature, one that raises on real data or returns no finite number is then one line
naming the taskset, instead of an error on a rollout worker after the run has started. TRL's batch
functions (they take `completions`) are called with a batch of one. The `judge` reward's settings
are checked against the configured auxiliary models; the service itself is first asked at the
first rollout."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from ...core.config import ConfigError
from ...core.config.schema import TasksetConfig
from ...core.config.validate import SELF_SCORED
from ...core.data.dataset_files import readable_now
from ...core.data.taskset import ensure_taskset
from ...core.data.taskset_check import TasksetError, first_row, value_of
from ...core.types import Task
from .compose import build_reward
from .judge import JUDGE, check_judge, judge_settings
from .reward_model import REWARD_MODEL, check_reward_model, reward_model_settings


def _first_row(key: str, ts: TasksetConfig) -> dict[str, Any] | None:
    """The taskset's first row; for a generated taskset not written yet, that of a copy its
    generator writes into a throwaway folder (generators are deterministic and small). None where
    there is no row to try (the taskset check names what is wrong with it)."""
    if not readable_now(ts):
        if ts.generator is None:
            return None
        with tempfile.TemporaryDirectory(prefix="rlcore-reward-check-") as folder:
            copy = dataclasses.replace(
                ts, path=os.path.join(folder, os.path.basename(ts.path) or "tasks.jsonl")
            )
            try:
                ensure_taskset(copy, key)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            return _first_row(key, copy)
    try:
        return first_row(ts, key)
    except TasksetError:
        return None


def check_rewards(key: str, ts: TasksetConfig, auxiliary: Sequence[str]) -> None:
    """Build `ts`'s reward functions (registered names, import paths) and, where its rows can be
    read (a file, a folder, a Hub id), call them once on its first row with the row's answer (or reference response) as the
    completion; `auxiliary`: the configured services' names, for the judge. ConfigError names `key`.
    A workflow whose environment scores its rollouts (SELF_SCORED) runs none of them."""
    if ts.default_workflow_type in SELF_SCORED:
        return
    names = list(ts.reward_fn)
    if JUDGE in names:
        try:
            check_judge(judge_settings(ts.judge), auxiliary)
        except ValueError as e:
            raise ConfigError(f"{key}.{e}") from None
    elif ts.judge.model is not None:
        raise ConfigError(f"{key}.judge: model is set but reward_fn does not list 'judge'; add it there")
    if REWARD_MODEL in names:
        try:
            check_reward_model(reward_model_settings(ts.reward_model))
        except ValueError as e:
            raise ConfigError(f"{key}.{e}") from None
    elif ts.reward_model.path is not None or ts.reward_model.address is not None:
        given = "path" if ts.reward_model.path is not None else "address"
        raise ConfigError(f"{key}.reward_model: {given} is set but reward_fn does not list 'reward_model'; add it there")
    weights = list(ts.reward_weights)
    for served in (JUDGE, REWARD_MODEL):  # a judge or a reward model is not called before the run
        if served in names:
            if weights and len(weights) == len(names):
                del weights[names.index(served)]
            names.remove(served)
    if not names:
        return
    try:
        composer = build_reward(names, weights or None)
    except ValueError as e:
        raise ConfigError(f"{key}.reward_fn: {e}") from None
    row = _first_row(key, ts)
    if row is None:
        return
    fmt = ts.format
    own = (fmt.prompt_key, fmt.answer_key, fmt.response_key)
    answer, response = value_of(row, fmt.answer_key), value_of(row, fmt.response_key)
    task = Task(
        f"{ts.name}-0", str(value_of(row, fmt.prompt_key) or ""), answer=None if answer is None else str(answer),
        response=None if response is None else str(response), source=ts.name,
        metadata={k: v for k, v in row.items() if k not in own},
    )  # fmt: skip
    completion = task.response or task.answer or ""
    try:
        composer(completion, task)
    except ValueError as e:
        raise ConfigError(
            f"{key}.reward_fn: {e} (called once on row 1 of {ts.path} with its "
            f"{'response' if task.response else 'answer'} as the completion, before the run starts; "
            "a reward function is fn(response: str, task: Task) -> float, or TRL's batch form "
            "fn(prompts, completions, **columns) -> list[float])"
        ) from None
