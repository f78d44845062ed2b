"""Byte-compile what one `pip install --report` just installed, on every core.

pip byte-compiles one file at a time (about 55 CPU-s for torch, vLLM and the rest here, a third of a
fresh install), so install_test_env.sh installs with `--no-compile` and this compiles the same files
in parallel. It must not be skipped: this environment sets PYTHONDONTWRITEBYTECODE=1, so modules
without a cached .pyc would be compiled again by every interpreter the tests start.

Usage: python scripts/compile_installed.py REPORT.json
"""

import compileall
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata


def installed_sources(report_path: str) -> list[str]:
    """The .py files of the distributions the report says were installed and are still there
    (editable ones excluded: their files are the working tree's)."""
    with open(report_path) as f:
        report = json.load(f)
    paths: list[str] = []
    for item in report.get("install", []):
        if item.get("is_direct") and item.get("download_info", {}).get("dir_info", {}).get("editable"):
            continue
        try:
            dist = metadata.distribution(item["metadata"]["name"])
        except metadata.PackageNotFoundError:  # installed, then removed (torchvision and the like)
            continue
        paths.extend(str(dist.locate_file(f)) for f in dist.files or () if f.suffix == ".py")
    return paths


def compile_chunk(paths: list[str]) -> int:
    """Compile each file; the number that did not compile."""
    return sum(not compileall.compile_file(p, quiet=2) for p in paths)


def main(report_path: str) -> int:
    paths = installed_sources(report_path)
    if not paths:
        return 0
    workers = os.cpu_count() or 1
    chunks = [paths[i :: workers * 8] for i in range(workers * 8)]
    with ProcessPoolExecutor(workers) as pool:
        failed = sum(pool.map(compile_chunk, chunks))
    # A file that does not compile (pip tolerates these too: templates, fixtures of other Pythons)
    # is not fatal; it is only counted.
    print(f"compile_installed: {len(paths) - failed} of {len(paths)} files byte-compiled on {workers} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
