"""`rlcore launch`, and `rlcore config validate` when the tokenizer is on disk, count the prompts
longer than model.max_prompt_tokens before anything starts: they warn (those prompts will be cut
from the left), or with model.enable_prompt_truncation false refuse, naming the first one."""

from __future__ import annotations

import pytest
import yaml

from rlcore.cli.main import main
from rlcore.core.config import ConfigError, load_config, resolve_stages
from rlcore.core.data.prompt_lengths import check_prompt_lengths


def _stages(tmp_path, tiny_model_path, *overrides: str):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1="}\n{"prompt": "12+34+56+78="}\n{"prompt": "99+99+99+99="}\n')
    cfg = {
        "model": {"model_path": tiny_model_path, "max_prompt_tokens": 8},
        "buffer": {"explorer_input": {"taskset": {"path": str(tasks), "reward_fn": ["format"]}}},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return resolve_stages(load_config(str(path), list(overrides)))


def test_over_long_prompts_are_counted_and_announced(tmp_path, tiny_model_path, capsys) -> None:
    check_prompt_lengths(_stages(tmp_path, tiny_model_path))
    err = capsys.readouterr().err
    assert (
        "2 of 3 prompts of buffer.explorer_input.taskset" in err
        and "longer than model.max_prompt_tokens (8" in err
    )


def test_without_truncation_the_first_over_long_prompt_is_refused(tmp_path, tiny_model_path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"tasks\.jsonl row 2's prompt is 12 tokens, more than model\.max_prompt_tokens \(8\)",
    ):
        check_prompt_lengths(_stages(tmp_path, tiny_model_path, "model.enable_prompt_truncation=false"))


def test_prompts_within_the_limit_pass_silently(tmp_path, tiny_model_path, capsys) -> None:
    check_prompt_lengths(_stages(tmp_path, tiny_model_path, "model.max_prompt_tokens=64"))
    assert "rlcore:" not in capsys.readouterr().err


def test_config_validate_counts_them_when_the_tokenizer_is_on_disk(tmp_path, tiny_model_path, capsys) -> None:
    _stages(tmp_path, tiny_model_path)  # writes cfg.yaml
    assert main(["config", "validate", str(tmp_path / "cfg.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out == f"OK: {tmp_path / 'cfg.yaml'} (1 stage(s): main)\n"
    assert "2 of 3 prompts of buffer.explorer_input.taskset" in err
    assert main(["config", "validate", str(tmp_path / "cfg.yaml"), "model.enable_prompt_truncation=false"]) == 2
    assert "row 2's prompt is 12 tokens" in capsys.readouterr().err
