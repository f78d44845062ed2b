"""buffer.explorer_input.task_selection: the difficulty filter's thresholds and the curriculum's
order, each refused in one line naming the key and the fix (core/data/task_selection.py runs them)."""

from __future__ import annotations

from .errors import ConfigError
from .plan import source_of
from .schema import RLCoreConfig

KEY = "buffer.explorer_input.task_selection"


def check_task_selection(cfg: RLCoreConfig, data: str) -> None:
    """The filter and the curriculum choose the tasks an RL stage explores (`data`: what the stage
    trains on; rollouts, or the taskset's own responses or pairs, which nothing explores)."""
    sel = cfg.buffer.explorer_input.task_selection
    f, c = sel.difficulty_filter, sel.curriculum
    if c.order == "column" and not c.column:
        raise ConfigError(
            f"{KEY}.curriculum.column: order column ranks the tasks by a numeric column of the taskset: name it"
        )
    if c.order != "column" and c.column:
        raise ConfigError(
            f"{KEY}.curriculum.column '{c.column}' is read by order column only; got order {c.order}: "
            "set order column, or drop the column"
        )
    if c.order == "column":
        _check_column_is_free(cfg, str(c.column))
    if f.enable and f.too_easy is None and f.too_hard is None:
        raise ConfigError(
            f"{KEY}.difficulty_filter: too_easy and too_hard are both null, so nothing is filtered: set one, "
            "or enable false"
        )
    if f.enable and f.too_easy is not None and f.too_hard is not None and f.too_hard >= f.too_easy:
        raise ConfigError(
            f"{KEY}.difficulty_filter.too_hard ({f.too_hard}) must be below too_easy ({f.too_easy}): a pass rate "
            "between them is a task worth exploring"
        )
    if f.enable and not f.refill and data == "rollouts" and source_of(cfg, "rollouts") not in ("rollouts", "evaluation"):
        _check_places_fill_steps(cfg)
    if (f.enable or c.order != "none") and data != "rollouts":
        raise ConfigError(
            f"{KEY} chooses the tasks an RL stage explores; algorithm.algorithm_type "
            f"{cfg.algorithm.algorithm_type} trains on the taskset's own {data}: turn the filter and the "
            "curriculum off"
        )


def _check_column_is_free(cfg: RLCoreConfig, column: str) -> None:
    """The curriculum's column is not one a training taskset's format takes for itself (its prompt,
    answer, ...: those become the task's prompt and answer, not a column the curriculum reads)."""
    from ..data.taskset import training_tasksets
    from ..data.taskset_check import own_columns

    for key, ts in training_tasksets(cfg):
        if column in own_columns(ts.format):
            raise ConfigError(
                f"{KEY}.curriculum.column '{column}' is {key}'s own (its format names it for the prompt, answer, "
                "response, messages, tools or system prompt): give the difficulty a column of its own"
            )


def _check_places_fill_steps(cfg: RLCoreConfig) -> None:
    """refill false where the trainer takes batch_size groups a step from a buffer (mode explore and
    train, asynchronous both): each explore step puts its open tasks' groups and a place for each
    skipped task, batch_size in all, so a trainer step is one explore step. What breaks that count
    is refused."""
    ex, why = cfg.explorer, f"{KEY}.difficulty_filter.refill false"
    if ex.over_rollout.ratio > 0 or ex.dynamic_timeout.enable:
        raise ConfigError(
            f"{why} makes each trainer step one explore step's tasks; the task scheduler "
            "(explorer.over_rollout.ratio > 0 or explorer.dynamic_timeout.enable) puts whichever tasks finished: "
            "turn it off, or keep refill true"
        )
    per_step = cfg.buffer.batch_size * cfg.algorithm.repeat_times
    if cfg.buffer.train_batch_size and cfg.buffer.train_batch_size < per_step:
        raise ConfigError(
            f"{why} gives a step with fewer open tasks fewer optimizer updates, and buffer.train_batch_size "
            f"{cfg.buffer.train_batch_size} (below a step's {per_step} rollouts) would make several: the explorer's "
            "staleness count, in updates, would run ahead of the trainer's: leave train_batch_size unset, or keep refill true"
        )
    if cfg.buffer.trainer_input.experience_buffer.replay_buffer.enable:
        raise ConfigError(
            f"{why} keeps each trainer step to one explore step's places; the replay buffer draws groups by "
            "priority, places and all: turn one of them off"
        )
    from ..algorithms import with_preset

    if with_preset(cfg.algorithm).dynamic_sampling:  # a preset's (dapo) too
        raise ConfigError(
            f"{why} explores fewer tasks a step, and algorithm.dynamic_sampling refills a step to "
            "buffer.batch_size groups: use one of them"
        )
