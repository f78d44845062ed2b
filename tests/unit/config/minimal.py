"""A minimal config on disk (a model folder, a one-row taskset) for tests of what a config resolves to
and refuses."""

from __future__ import annotations

import yaml

from rlcore.core.config import RLCoreConfig, load_config, resolve_stages


def resolve(tmp_path, *overrides: str, strategy: str | None = None) -> RLCoreConfig:
    """The first stage's config of the minimal config with `overrides` (and `--strategy`)."""
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "response": "2"}\n')
    cfg = {"model": {"model_path": str(tmp_path / "m")}, "checkpoint_root_dir": str(tmp_path),
           "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}}}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return resolve_stages(load_config(str(path), list(overrides), strategy))[0].config
