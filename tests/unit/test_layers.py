"""The layer contracts (pyproject.toml [tool.importlinter], README "Layout") hold on the code, and
they have teeth: the same check fails once the ground floor imports the roof."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build_tree = runpy.run_path(os.path.join(ROOT, "scripts", "static_checks.py"))["build_tree"]


def _lint(tree: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["lint-imports", "--no-cache"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=tree),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_layer_contracts_are_kept(tmp_path) -> None:
    result = _lint(build_tree(str(tmp_path / "tree")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_from_the_ground_floor_breaks_them(tmp_path) -> None:
    core = tmp_path / "core"
    shutil.copytree(os.path.join(ROOT, "core"), core, ignore=shutil.ignore_patterns("__pycache__"))
    (core / "upward.py").write_text("from ..runtime import loop  # the roof, from the ground floor\n")
    result = _lint(build_tree(str(tmp_path / "tree"), replace={"rlcore.core": str(core)}))
    assert result.returncode != 0
    assert "rlcore.core.upward -> rlcore.runtime.loop" in result.stdout, result.stdout
