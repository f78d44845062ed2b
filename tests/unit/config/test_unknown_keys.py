"""Unknown keys: all of a file's in one run, each with its full path and what it was probably meant
to be (rlcore's name for another project's key, the same words reordered, the same name elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlcore.core.config import ConfigError, load_config
from rlcore.core.config.renamed_keys import RENAMED, renamed
from rlcore.core.config.unknown_keys import _schema_paths


def problems(tmp_path: Path, data: dict, *overrides: str) -> list[str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as error:
        load_config(str(path), list(overrides))
    return str(error.value).splitlines()


def test_a_trinity_config_reports_every_unknown_key_at_once(tmp_path: Path) -> None:
    trinity = {
        "cluster": {"node_num": 1, "gpu_per_node": 2},
        "trainer": {"actor_grad_clip": 1.0},
        "model": {"custom_chat_template": "x"},
        "algorithm": {"policy_loss_fn_args": {"clip_range_low": 0.2, "clip_range_high": 0.28}},
        "buffer": {
            "explorer_input": {
                "default_workflow_type": "math_workflow",
                "taskset": {"path": "t.jsonl", "default_reward_fn_type": "math_reward"},
                "eval_tasksets": [{"name": "e", "path": "e.jsonl", "rollout_args": {"n": 4}}],
            }
        },
        "stages": [{"stage_name": "sft"}],
    }
    lines = problems(tmp_path, trinity)
    assert lines == [
        "cluster.node_num: unknown key; did you mean rlcore's cluster.num_nodes? (Trinity-RFT's name)",
        "cluster.gpu_per_node: unknown key; did you mean rlcore's cluster.ranks_per_node? (Trinity-RFT's name; "
        "trainer processes per node, one per GPU)",
        "trainer.actor_grad_clip: unknown key; did you mean rlcore's trainer.grad_clip? (Trinity-RFT's name)",
        "model.custom_chat_template: unknown key; did you mean rlcore's model.chat_template? (Trinity-RFT's name)",
        "algorithm.policy_loss_fn_args.clip_range_low: unknown key; did you mean rlcore's algorithm.clip_ratio_low? "
        "(Trinity-RFT's name)",
        "algorithm.policy_loss_fn_args.clip_range_high: unknown key; did you mean rlcore's "
        "algorithm.clip_ratio_high? (Trinity-RFT's name)",
        "buffer.explorer_input.default_workflow_type: unknown key; did you mean rlcore's "
        "buffer.explorer_input.taskset.default_workflow_type? (Trinity-RFT's name; set on each taskset)",
        "buffer.explorer_input.taskset.default_reward_fn_type: unknown key; did you mean rlcore's "
        "buffer.explorer_input.taskset.reward_fn? (Trinity-RFT's name; a list of names)",
        "buffer.explorer_input.eval_tasksets[0].rollout_args.n: unknown key; did you mean rlcore's "
        "algorithm.repeat_times? (Trinity-RFT's name; an eval taskset's samples per task: its repeat_times)",
        "stages[0].stage_name: unknown key; did you mean rlcore's stages[0].name? (Trinity-RFT's name)",
    ]


def test_nexrl_and_trl_names(tmp_path: Path) -> None:
    lines = problems(
        tmp_path,
        {"experiment_name": "x", "num_generations": 8, "learning_rate": 1e-6, "beta": 0.0,
         "data": {"batch_size": 32, "keep_batch_order": True}},
    )  # fmt: skip
    assert lines[:4] == [
        "experiment_name: unknown key; did you mean rlcore's name? (NexRL's name)",
        "num_generations: unknown key; did you mean rlcore's algorithm.repeat_times? (TRL's name)",
        "learning_rate: unknown key; did you mean rlcore's algorithm.optimizer.lr? (TRL's name)",
        "beta: unknown key; did you mean rlcore's algorithm.kl_loss_coef? (TRL's name)",
    ]
    # a section of another project's: each key with an rlcore name, then the section itself for the rest
    assert lines[4] == "data.batch_size: unknown key; did you mean rlcore's buffer.batch_size? (NexRL's name)"
    assert lines[5].startswith("data: unknown key; allowed keys here: project, name, mode,")
    assert len(lines) == 6


def test_reordered_words_and_keys_of_other_sections(tmp_path: Path) -> None:
    lines = problems(tmp_path, {"trainer": {"nodes_num": 2, "lr": 1e-6, "repeat_times": 4}})
    assert lines[0].startswith("trainer.nodes_num: unknown key; allowed keys here")  # no node_rank guess
    assert lines[1].startswith(
        "trainer.lr: unknown key (did you mean algorithm.optimizer.lr or critic.optim.lr?)"
    )
    assert lines[2].startswith("trainer.repeat_times: unknown key (did you mean algorithm.repeat_times?)")
    lines = problems(tmp_path, {"cluster": {"nodes_num": 2}})
    assert lines == [lines[0]] and lines[0].startswith(
        "cluster.nodes_num: unknown key (did you mean num_nodes?)"
    )
    ts = "buffer.explorer_input.eval_tasksets"
    lines = problems(
        tmp_path, {"buffer": {"explorer_input": {"eval_tasksets": [{"path": "e", "temperature": 0.5}]}}}
    )
    assert lines[0].startswith(
        f"{ts}[0].temperature: unknown key (did you mean {ts}[0].rollout_args.temperature or "
        f"{ts}[0].judge.temperature?)"
    )


def test_an_override_and_a_stage_override_name_the_key_too(tmp_path: Path) -> None:
    base = {"stages": [{"name": "a"}]}
    assert problems(tmp_path, base, "cluster.node_num=2") == [
        "cluster.node_num: unknown key; did you mean rlcore's cluster.num_nodes? (Trinity-RFT's name)"
    ]
    lines = problems(tmp_path, {"stages": [{"name": "a", "trainer": {"actor_grad_clip": 1}, "typo": 1}]})
    assert lines[0] == (
        "stages[0].trainer.actor_grad_clip: unknown key; did you mean rlcore's stages[0].trainer.grad_clip? "
        "(Trinity-RFT's name)"
    )
    assert lines[1].startswith("stages[0].typo: unknown key; allowed keys here: name, mode, algorithm,")


def _rlcore_key(key: str) -> str:
    return key.replace("{taskset}", "buffer.explorer_input.taskset").replace("[]", "")


def test_every_renamed_key_names_an_rlcore_key_and_no_source_key_is_one() -> None:
    """The table stays true to the schema: its answers are rlcore's keys, and none of its questions
    is a key rlcore has (those never reach it)."""
    leaves = {p.replace("[]", "") for p in _schema_paths()}
    sections = {p.rsplit(".", i)[0] for p in leaves for i in range(1, p.count(".") + 1)}
    for source, entry in RENAMED.items():
        assert _rlcore_key(entry.key) in leaves | sections | {"stages.name"}, (source, entry.key)
        assert _rlcore_key(source) not in leaves | sections, source
        assert entry.source in ("Trinity-RFT", "NexRL", "TRL")


def test_renamed_keys_are_written_for_the_place_they_were_found() -> None:
    hit = renamed("stages[2].buffer.expert_taskset.default_reward_fn_type")
    assert hit is not None and hit[0] == "stages[2].buffer.expert_taskset.reward_fn"
    hit = renamed("buffer.explorer_input.mixture[1].default_reward_fn_type")
    assert hit is not None and hit[0] == "buffer.explorer_input.mixture[1].reward_fn"
    assert renamed("cluster.num_nodes") is None and renamed("nothing.like.it") is None
