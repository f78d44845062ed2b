"""mkdocs hooks of the documentation site (mkdocs.yml): the benchmarks' README and their plots are
pages and images of the site where they live (benchmarks/), not copies under docs/, and the docs'
links to them (`../benchmarks/...` from docs/, as GitHub resolves them) point there; the benchmarks
page ends with every plot the results hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

BENCHMARKS = "benchmarks/README.md"


def _root(config: Any) -> Path:
    return Path(config["config_file_path"]).parent


def on_files(files: Files, config: Any) -> Files:
    """benchmarks/README.md and benchmarks/results/**/*.png join the site's files."""
    root = _root(config)
    for path in [root / BENCHMARKS, *sorted((root / "benchmarks" / "results").rglob("*.png"))]:
        rel = path.relative_to(root).as_posix()
        files.append(File(rel, src_dir=str(root), dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A docs page's links into benchmarks/ as the site lays it out; the benchmarks page followed
    by every plot of benchmarks/results (the GPU ones last)."""
    if page.file.src_uri != BENCHMARKS:
        # docs/x.md links ../benchmarks/... (right on GitHub too); on the site benchmarks/ sits beside it
        depth = page.file.src_uri.count("/")
        return markdown.replace(f"]({'../' * (depth + 1)}benchmarks/", f"]({'../' * depth}benchmarks/")
    results = _root(config) / "benchmarks" / "results"
    plots = sorted(results.glob("*.png")) + sorted((results / "gpu").glob("*.png"))
    gallery = ["", "## Every plot", "", "Each beside its numbers in `benchmarks/results/` (the `.md` and `.json` of the same name).", ""]
    for png in plots:
        rel = png.relative_to(results.parent).as_posix()
        gallery += [f"### {png.relative_to(results).with_suffix('').as_posix()}", "", f"![{png.stem}]({rel})", ""]
    return markdown + "\n".join(gallery)
