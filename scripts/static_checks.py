"""Static checks of rlcore as the import package it installs as:

    mypy -p rlcore      types, with every rlcore.* import resolved to the real module
    lint-imports        the layer contracts in pyproject.toml ([tool.importlinter])

The code folders install under other names (pyproject's package-dir: `core/` is `rlcore.core`,
...), and an editable install reaches them through an import hook that neither tool follows. So
this builds a tree of links named as the package (build/package/rlcore/core -> core/, ...) and
points both tools at it.

    python scripts/static_checks.py
"""

from __future__ import annotations

import os
import subprocess
import sys

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_tree(dest: str, replace: dict[str, str] | None = None) -> str:
    """Links `dest`/rlcore/<sub> -> each package-dir folder (`replace` maps a package to another
    folder, e.g. a test's altered copy); returns `dest`, the path to put first on the search path."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dir.items():
        link = os.path.join(dest, *package.split("."))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.islink(link):
            os.unlink(link)
        target = (replace or {}).get(package, os.path.join(ROOT, folder))
        os.symlink(os.path.abspath(target), link)
    return dest


def main() -> int:
    tree = build_tree(os.path.join(ROOT, "build", "package"))
    mypy = subprocess.call(
        [sys.executable, "-m", "mypy", "-p", "rlcore"], cwd=ROOT, env=dict(os.environ, MYPYPATH=tree)
    )
    layers = subprocess.call(["lint-imports", "--no-cache"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=tree))
    return 1 if mypy or layers else 0


if __name__ == "__main__":
    sys.exit(main())
