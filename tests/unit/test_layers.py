"""The layer contracts (pyproject.toml [tool.importlinter], docs/contributing.md "Layout") hold on the code, and
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


def _modules() -> dict[str, str]:
    """rlcore's modules (dotted name -> file), as pyproject's package-dir installs them."""
    import glob

    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    out = {}
    for package, folder in package_dir.items():
        if package == "rlcore.proto":  # generated
            continue
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].replace(os.sep, ".")
            out[package if rel == "__init__" else f"{package}.{rel.removesuffix('.__init__')}"] = path
    return out


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The rlcore modules `name` imports anywhere in its file (inside functions too)."""
    import ast

    with open(path) as f:
        tree = ast.parse(f.read())
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else str(node.module)
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import cycle between modules (a cycle hides which one is the lower layer)."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = []
    for start in graph:  # a path from each module back to itself
        seen, stack = set(), [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles))[:10])


def test_files_and_functions_stay_small() -> None:
    """No module over 500 lines and no function over 80 outside benchmarks/ (generated code aside):
    a module that grows past that holds two concerns."""
    import ast

    big = []
    for name, path in _modules().items():
        if name.startswith("rlcore.benchmarks"):
            continue
        with open(path) as f:
            text = f.read()
        if text.count("\n") > 500:
            big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    big.append(f"{name}.{node.name}: {length} lines")
    assert not big, "split these:\n" + "\n".join(big)
