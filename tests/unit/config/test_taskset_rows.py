"""Tasksets are read row by row when the config is validated: an empty, unreadable or malformed file
and a missing or null column fail in one line naming the file and the row (before anything starts)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from rlcore.core.config import ConfigError, load_config, resolve_stages

ROWS = {
    "empty.jsonl": ("", "has no rows"),
    "malformed.jsonl": (
        '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n',
        "row 2 is not valid JSON",
    ),
    "null_prompt.jsonl": (
        '{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": null, "answer": "4"}\n',
        "row 3: the prompt ('prompt') is null",
    ),
    "empty_prompt.jsonl": ('{"prompt": " ", "answer": "2"}\n', "row 1: the prompt ('prompt') is empty"),
    "no_answer.jsonl": ('{"prompt": "1+1="}\n', "row 1 has no 'answer' column"),
    "null_answer.json": (
        '[{"prompt": "1+1=", "answer": "2"}, {"prompt": "3+3=", "answer": null}]',
        "row 2: the answer ('answer') is null",
    ),
    "list_row.jsonl": ('["1+1=", "2"]\n', "row 1 is a list, not an object with columns"),
    "short.csv": ("prompt,answer\n1+1=,2\n2+2=,\n", "row 2: the answer ('answer') is null"),
    "not.parquet": ("plain text", "cannot read"),
}


def _config(tmp_path, taskset: str, **extra) -> str:
    cfg = {
        "model": {"model_path": str(tmp_path / "model"), "scratch": {"enabled": True}},
        "buffer": {"explorer_input": {"taskset": {"path": taskset, "reward_fn": ["exact_match"], **extra}}},
    }
    path = str(tmp_path / "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_bad_taskset_fails_validation_naming_the_file_and_the_row(tmp_path, name: str) -> None:
    text, expected = ROWS[name]
    taskset = tmp_path / name
    taskset.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve_stages(load_config(_config(tmp_path, str(taskset))))
    assert expected in str(e.value) and str(taskset) in str(e.value) and "\n" not in str(e.value), str(
        e.value
    )


def test_answers_are_needed_only_by_rewards_that_compare_with_one(tmp_path) -> None:
    taskset = tmp_path / "prompts.jsonl"
    taskset.write_text('{"prompt": "say hi"}\n')
    resolve_stages(load_config(_config(tmp_path, str(taskset), reward_fn=["format"])))


def test_an_sft_stage_needs_reference_responses(tmp_path) -> None:
    taskset = tmp_path / "demos.jsonl"
    taskset.write_text(
        '{"prompt": "1+1=", "answer": "2", "response": "2"}\n{"prompt": "2+2=", "answer": "4"}\n'
    )
    path = _config(tmp_path, str(taskset))
    resolve_stages(load_config(path))  # GRPO needs no responses
    with pytest.raises(ConfigError, match="row 2 has no 'response' column"):
        resolve_stages(load_config(path, ["algorithm.algorithm_type=sft"]))


def test_config_validate_says_it_in_one_line(tmp_path) -> None:
    taskset = tmp_path / "null_prompt.jsonl"
    taskset.write_text(ROWS["null_prompt.jsonl"][0])
    done = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "config", "validate", _config(tmp_path, str(taskset))],
        capture_output=True, text=True, cwd=os.path.dirname(__file__),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "row 3: the prompt ('prompt') is null" in done.stderr, done.stderr
