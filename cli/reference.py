"""The command-line reference, read off the argument parsers (cli/parser.py, and each benchmark's
own): every subcommand's --help as argparse prints it, for the docs site's generated page
(scripts/gen_docs.py -> docs/reference/cli.md). Rendered at a fixed width, so the page is the same
on every terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
from collections.abc import Iterator

WIDTH = 100
"""Columns argparse wraps the help at here (it reads $COLUMNS)."""


def markdown() -> str:
    """The docs site's command-line page."""
    from ..benchmarks import BENCHMARKS
    from .parser import build_parser

    out = [
        "# Command line",
        "",
        "Every `rlcore` command and its flags, as `--help` prints them (each flag's default shown). "
        "Generated from the argument parsers by `python scripts/gen_docs.py` (the tests fail when this "
        "page is not current).",
        "",
    ]
    with _width():
        for name, parser in _commands(build_parser(), "rlcore"):
            out += [f"## `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        out += ["## `rlcore bench NAME`", "", "Each benchmark's own flags (`rlcore bench NAME --help`); what each "
                "measures and its latest numbers: [Benchmarks](../../benchmarks/README.md).", ""]  # fmt: skip
        for name in sorted(BENCHMARKS):
            out += [f"### `rlcore bench {name}`", "", "```text", _bench_help(name, BENCHMARKS[name]), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _commands(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`parser` and its subcommands' parsers, depth first (bench's own flags come from each benchmark)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _commands(subparser, f"{name} {sub}")


def _bench_help(name: str, module: str) -> str:
    """`rlcore bench NAME --help`'s text (the benchmark's parser prints it and exits)."""
    argv0, sys.argv[0] = sys.argv[0], f"rlcore bench {name}"
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
            importlib.import_module(module).main(["--help"])
    finally:
        sys.argv[0] = argv0
    return text.getvalue().rstrip()


PLAIN = {"COLUMNS": str(WIDTH), "NO_COLOR": "1", "PYTHON_COLORS": "0"}
"""The environment the help is rendered in: a fixed width, no colours (Python 3.14's argparse
colours help on a terminal)."""


@contextlib.contextmanager
def _width() -> Iterator[None]:
    before = {k: os.environ.get(k) for k in PLAIN}
    os.environ.update(PLAIN)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
