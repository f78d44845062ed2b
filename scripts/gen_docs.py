"""Regenerate the docs site's generated pages: docs/reference/config.md (from the config schema,
core/config/reference.py) and docs/reference/cli.md (from the argument parsers, cli/reference.py).

    python scripts/gen_docs.py           # write them
    python scripts/gen_docs.py --check   # exit 1 naming the pages that are not current (CI's check)
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pages() -> dict[str, str]:
    """Each generated page's path (from the repository root) and its text."""
    from rlcore.cli.reference import markdown as cli_markdown
    from rlcore.core.config.reference import markdown as config_markdown

    return {"docs/reference/config.md": config_markdown(), "docs/reference/cli.md": cli_markdown()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not current")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in pages().items():
        path = os.path.join(ROOT, rel)
        current = open(path).read() if os.path.exists(path) else None
        if current == text:
            continue
        stale.append(rel)
        if not args.check:
            with open(path, "w") as f:
                f.write(text)
    if args.check and stale:
        print(f"gen_docs: not current: {', '.join(stale)}; run python scripts/gen_docs.py", file=sys.stderr)
        return 1
    print(f"gen_docs: {'wrote ' + ', '.join(stale) if stale else 'every generated page is current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
