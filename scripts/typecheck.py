"""Type-check rlcore as the import package it installs as (`mypy -p rlcore`).

The code folders install under other names (pyproject's package-dir: `core/` is `rlcore.core`,
...), and an editable install reaches them through an import hook mypy cannot follow. So this
builds a tree of links named as the package (build/typecheck/rlcore/core -> core/, ...) and points
mypy at it: every rlcore.* import resolves to the real module, nothing is silenced for rlcore.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.path.join(ROOT, "build", "typecheck")


def main() -> int:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dir.items():
        link = os.path.join(TREE, *package.split("."))
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.islink(link):
            os.unlink(link)
        os.symlink(os.path.join(ROOT, folder), link)
    env = dict(os.environ, MYPYPATH=TREE)
    return subprocess.call([sys.executable, "-m", "mypy", "-p", "rlcore", *sys.argv[1:]], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
