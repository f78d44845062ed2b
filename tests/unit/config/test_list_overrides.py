"""Command-line overrides that index into lists: a stage (`stages.1.x=...`) or a list element of the
config (`buffer.explorer_input.eval_tasksets.0.x=...`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.core.config import ConfigError, load_config, resolve_stages

from .test_config_loading import write_recipe

EVAL = "buffer.explorer_input.eval_tasksets"


def two_stages(tmp_path: Path, eval_names: tuple[str, ...] = ()) -> str:
    """sft_warmup (lr 1e-5) then grpo (lr from the global config), and `eval_names` eval tasksets."""
    tasks = str(tmp_path / "tasks.jsonl")
    return write_recipe(
        tmp_path,
        {
            "buffer": {
                "explorer_input": {
                    "taskset": {"path": tasks},
                    "eval_tasksets": [{"name": name, "path": tasks} for name in eval_names],
                }
            },
            "stages": [
                {"name": "sft_warmup", "mode": "train", "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 1e-5}}},
                {"name": "grpo", "algorithm": {"repeat_times": 4}},
            ],
        },
    )  # fmt: skip


def test_override_changes_one_stage_only(tmp_path: Path) -> None:
    path = two_stages(tmp_path)
    for key in ("stages.1.algorithm.optimizer.lr", "stages[1].algorithm.optimizer.lr"):
        cfg = load_config(path, [f"{key}=3e-5", "stages.0.trainer.save_interval=7"])
        assert cfg.algorithm.optimizer.lr == 1e-6  # the global config keeps the schema default
        sft, grpo = resolve_stages(cfg)
        assert grpo.config.algorithm.optimizer.lr == 3e-5
        assert grpo.config.algorithm.repeat_times == 4  # the stage's own sibling settings stay
        assert sft.config.algorithm.optimizer.lr == 1e-5
        # a section the stage did not set is added to that stage alone
        assert (sft.config.trainer.save_interval, grpo.config.trainer.save_interval) == (7, 0)


def test_override_changes_one_list_element(tmp_path: Path) -> None:
    path = two_stages(tmp_path, eval_names=("easy", "hard"))
    overrides = [f"{EVAL}.0.rollout_args.temperature=0.5", f"{EVAL}.1.reward_fn.0=numeric"]
    for stage in resolve_stages(load_config(path, overrides)):
        easy, hard = stage.config.buffer.explorer_input.eval_tasksets
        # the rest of the element stays
        assert (easy.name, easy.path) == ("easy", str(tmp_path / "tasks.jsonl"))
        assert (easy.rollout_args.temperature, hard.rollout_args.temperature) == (0.5, 1.0)
        assert (easy.reward_fn, hard.reward_fn) == (["exact_match"], ["numeric"])


def test_later_override_indexes_a_list_an_earlier_one_set(tmp_path: Path) -> None:
    path = write_recipe(tmp_path)
    cfg = load_config(path, [f"{EVAL}=[{{path: {tmp_path / 'tasks.jsonl'}}}]", f"{EVAL}.0.name=held_out"])
    [stage] = resolve_stages(cfg)
    assert [ts.name for ts in stage.config.buffer.explorer_input.eval_tasksets] == ["held_out"]


def test_stage_override_indexes_a_list_it_inherits(tmp_path: Path) -> None:
    """A stage starts from the global config, so indexing a list the stage does not set changes
    that stage's copy of the global list."""
    path = two_stages(tmp_path, eval_names=("easy", "hard"))
    sft, grpo = resolve_stages(load_config(path, [f"stages.1.{EVAL}.1.split=test"]))
    assert [ts.split for ts in grpo.config.buffer.explorer_input.eval_tasksets] == ["train", "test"]
    assert [ts.split for ts in sft.config.buffer.explorer_input.eval_tasksets] == ["train", "train"]


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("stages.5.mode=train", r"^stages\[5\]: index out of range \(stages has 2 elements: 0 to 1\)$"),
        ("stages.-1.mode=train", r"^stages\[-1\]: index out of range \(stages has 2 elements: 0 to 1\)$"),
        ("stages.grpo.mode=train", r"^stages\.grpo: expected a list index, got 'grpo' \(stages has 2 elements: 0 to 1\)$"),
        (f"{EVAL}.0.name=x", rf"^{EVAL}\[0\]: index out of range \({EVAL} is empty; set the whole list: {EVAL}=\[\.\.\.\]\)$"),
        ("monitor.monitor_type.2=jsonl", r"^monitor\.monitor_type\[2\]: index out of range \(monitor\.monitor_type has 2 elements: 0 to 1\)$"),
        (f"stages.1.{EVAL}.0.name=x", rf"^stages\[1\]\.{EVAL}\[0\]: index out of range \(stages\[1\]\.{EVAL} is empty;"),
        # keys the schema lacks, or values of the wrong type, inside a stage or a list element
        ("stages.1.trainer.save_intervall=3", r"^stages\[1\]\.trainer\.save_intervall: unknown key \(did you mean save_interval\?\); allowed keys here: strategy,"),
        ("stages.1.algorithm.optimizer.lr=abc", r"^stages\[1\]\.algorithm\.optimizer\.lr: expected float, got 'abc'$"),
        ("stages.1.cluster.num_nodes=2", r"^stages\[1\]\.cluster: a stage may override only mode, algorithm,"),
        ("stages.1=3", r"^stages\[1\]: must be a mapping with a name and section overrides$"),
    ],
)  # fmt: skip
def test_bad_index_or_key_names_the_full_path(tmp_path: Path, override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        resolve_stages(load_config(two_stages(tmp_path), [override]))


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        (f"{EVAL}.1.rollout_args.temperaturee=0.5", rf"^{EVAL}\[1\]\.rollout_args\.temperaturee: unknown key \(did you mean temperature\?\)"),
        (f"{EVAL}.1.rollout_args.temperature=abc", rf"^{EVAL}\[1\]\.rollout_args\.temperature: expected float, got 'abc'$"),
        (f"{EVAL}.2.name=x", rf"^{EVAL}\[2\]: index out of range \({EVAL} has 2 elements: 0 to 1\)$"),
        (f"{EVAL}.0.reward_fn.1=numeric", rf"^{EVAL}\[0\]\.reward_fn\[1\]: index out of range \({EVAL}\[0\]\.reward_fn has 1 element: 0\)$"),
    ],
)  # fmt: skip
def test_bad_key_in_a_list_element_names_the_full_path(tmp_path: Path, override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(two_stages(tmp_path, eval_names=("easy", "hard")), [override])
