"""`python -m rlcore.cli` is the same as the `rlcore` command."""

from .main import entry

entry()
