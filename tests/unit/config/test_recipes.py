"""Every recipe in configs/ validates (keys, types, values, paths its generators do not write)."""

from __future__ import annotations

import glob
import os

import pytest

from rlcore.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RECIPES = sorted(glob.glob(os.path.join(REPO, "configs", "**", "*.yaml"), recursive=True))
NEEDS_A_MODEL = {"adaptive_teaching.yaml"}  # a template: the teacher is the user's chat model
NEEDS_A_TEACHER = {"on_policy_distill.yaml"}  # distils from a finished quickstart run's export


@pytest.mark.parametrize("recipe", RECIPES, ids=[os.path.relpath(r, REPO) for r in RECIPES])
def test_every_recipe_validates(
    recipe: str, tiny_model_path: str, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    name = os.path.basename(recipe)
    overrides = [f"model.model_path={tiny_model_path}"] if name in NEEDS_A_MODEL else []
    if name in NEEDS_A_TEACHER:
        overrides.append(f"stages.1.model.teacher_model_path={tiny_model_path}")
    assert main(["config", "validate", recipe, *overrides]) == 0, capsys.readouterr().err
    said = capsys.readouterr()
    assert said.out.startswith(f"OK: {recipe}")
    assert "rlcore: note:" not in said.err, said.err  # a shipped recipe writes no moved key (moved_keys.py)
