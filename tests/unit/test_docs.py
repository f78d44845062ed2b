"""The documentation site (mkdocs.yml, docs/): it builds in strict mode (a broken link, a missing
page, an anchor that is not there fail it), its generated references are current, the configuration
reference lists exactly the schema's keys, and `rlcore config explain` prints a key's entry."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import typing

import pytest

from rlcore.cli.main import main as cli_main
from rlcore.core.config.schema import RLCoreConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAGES = [
    "index", "quickstart", "concepts", "strategies", "algorithms", "rewards", "lora", "long-context", "engines",
    "workflows", "door", "sandbox", "decoupled", "multi-host", "control-plane", "tinker", "verifiers",
    "troubleshooting", "gpu", "status", "contributing", "reference/config", "reference/cli",
]  # fmt: skip
"""A page per capability (issue: documentation a user can find things in)."""


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", os.path.join(ROOT, "scripts", "gen_docs.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema_keys(cls: type = RLCoreConfig, prefix: str = "") -> set[str]:
    """Every leaf key of the schema, walked here on its own (a list of sections: `path[].key`)."""
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, path = hints[f.name], prefix + f.name
        item = (typing.get_args(hint) or (None,))[0] if typing.get_origin(hint) is list else None
        if dataclasses.is_dataclass(hint):
            keys |= schema_keys(hint, path + ".")
        elif item is not None and dataclasses.is_dataclass(item):
            keys |= schema_keys(item, path + "[].")
        else:
            keys.add(path)
    return keys


def test_the_generated_references_are_current() -> None:
    for rel, text in _gen_docs().pages().items():
        with open(os.path.join(ROOT, rel)) as f:
            assert f.read() == text, f"{rel} is not current: run python scripts/gen_docs.py"


def test_the_configuration_reference_lists_every_key_of_the_schema() -> None:
    with open(os.path.join(ROOT, "docs", "reference", "config.md")) as f:
        listed = re.findall(r"^- <a id=\"[^\"]+\"></a>\*\*`([^`]+)`\*\*", f.read(), flags=re.M)
    assert len(listed) == len(set(listed))
    assert set(listed) == schema_keys()
    assert len(listed) > 350  # the whole schema, not a part of it


def test_config_explain_prints_a_keys_type_default_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "explain", "algorithm.optimizer.lr"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == ["algorithm.optimizer.lr", "  type:    float", "  default: 1e-06", "  allowed: > 0.0"]
    assert "Peak learning rate." in out
    assert cli_main(["config", "explain", "buffer.explorer_input.eval_tasksets[0].rollout_args.temperature"]) == 0
    assert "eval_tasksets[].rollout_args.temperature" in capsys.readouterr().out
    assert cli_main(["config", "explain", "synchronizer"]) == 0
    assert "    max_staleness  (int | null, default null)" in capsys.readouterr().out  # a section lists its keys
    assert cli_main(["config", "explain", "model.lora_configs"]) == 0
    assert "  keys (of each item):\n    name  (str" in capsys.readouterr().out  # a list of sections, its items' keys
    assert cli_main(["config", "explain", "algorithm.optimzer.lr"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcore: error: config explain: 'algorithm.optimzer.lr' is not a key of the schema; did you mean algorithm.optimizer.lr")
    assert len(err.splitlines()) == 1


def test_the_site_builds_in_strict_mode_with_every_page(tmp_path) -> None:
    """mkdocs --strict, with mkdocs.yml's validation: a link to a page or an anchor that is not
    there, or a page outside the navigation, fails the build."""
    for page in PAGES:
        path = os.path.join(ROOT, "docs", f"{page}.md")
        assert os.path.isfile(path), page
        with open(path) as f:
            text = f.read()
        assert "To be written" not in text and len(text.splitlines()) > 10, page
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.isfile(tmp_path / "site" / "reference" / "config" / "index.html")
    assert os.path.isfile(tmp_path / "site" / "benchmarks" / "results" / "curriculum.png")
