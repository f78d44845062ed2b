"""A model's position limit, read from its config.json without importing transformers' model
configs where the file names it (a launch's first seconds), else as transformers reads it."""

from __future__ import annotations

import json

from rlcore.rollout.engines.base import position_limit


def test_the_limit_comes_from_config_json_nested_or_not_and_else_from_transformers(tmp_path) -> None:
    plain, nested, implied = (tmp_path / name for name in ("plain", "nested", "implied"))
    for folder, config in [
        (plain, {"model_type": "llama", "max_position_embeddings": 4096}),
        (
            nested,
            {"model_type": "llava", "text_config": {"model_type": "llama", "max_position_embeddings": 1024}},
        ),
        (implied, {"model_type": "gpt2"}),  # GPT2Config's own default: n_positions 1024
    ]:
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    assert position_limit(str(plain)) == 4096
    assert position_limit(str(nested)) == 1024
    assert position_limit(str(implied)) == 1024
