"""Shared fixtures for unit tests."""

from pathlib import Path

import pytest
import yaml


@pytest.fixture()
def recipe(tmp_path: Path) -> str:
    """A minimal valid recipe: an (empty) model folder and a one-row taskset (with a reference
    response, so SFT stages may use it too)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "tasks.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "response": "2"}\n')
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"model_path": str(tmp_path / "model")},
                "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "tasks.jsonl")}}},
                "algorithm": {"repeat_times": 4},
            }
        )
    )
    return str(path)
