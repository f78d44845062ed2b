"""The `rlcore` command line (cli/main.py)."""
