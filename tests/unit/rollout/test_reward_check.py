"""Rewards are tried before the run on a generated taskset too (the quickstart's, not written yet):
a reward that never returns a finite number is one line from `config validate`, naming the key,
and the check leaves no taskset file behind (the launch writes it)."""

from __future__ import annotations

import pytest

from rlcore.cli.main import main

REPO_QUICKSTART = "configs/quickstart.yaml"


@pytest.mark.parametrize("reward", ["always_nan", "a_string"])
def test_a_broken_reward_on_a_generated_taskset_is_one_line_before_the_run(
    tmp_path, reward: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    ts = "buffer.explorer_input.taskset"
    train = tmp_path / "train.jsonl"
    overrides = [f"checkpoint_root_dir={tmp_path}", f"stages.1.{ts}.path={train}",
                 f"stages.1.{ts}.reward_fn=[tests.integration.rewards:{reward}]", f"stages.1.{ts}.reward_weights=[]"]  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert main(["config", "validate", os.path.join(root, REPO_QUICKSTART), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlcore: error: stages[1].{ts}.reward_fn: ") or err.startswith(
        f"rlcore: error: {ts}.reward_fn: "
    ), err
    assert "called once on row 1 of" in err and len(err.splitlines()) == 1, err
    assert not train.exists()  # the throwaway copy was generated elsewhere
