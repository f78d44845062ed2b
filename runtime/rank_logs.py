"""Where a trainer rank's log records go: rlcore's own to stdout (the user's terminal, beside the
progress bar), every library's (megatron-core's config dumps and bucket listings, torch.distributed,
transformers) to stderr, which the launch writes to `<run>/launch/trainer.log`. With log.level DEBUG
everything goes to stdout."""

from __future__ import annotations

import logging
import sys

LIBRARIES_QUIET = ("transformers", "datasets", "httpx")
"""Libraries whose records below ERROR say nothing a run needs (download and cache chatter)."""


def configure(rank: int, level: str | int) -> None:
    """Rank 0 logs at `level`, the others at WARNING; records of loggers outside `rlcore` go to
    stderr unless `level` is DEBUG."""
    numeric = level if isinstance(level, int) else int(logging.getLevelName(level))
    debug = numeric <= logging.DEBUG
    formatter = logging.Formatter(f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    ours: logging.Handler = logging.StreamHandler(sys.stdout)
    theirs: logging.Handler = logging.StreamHandler(sys.stderr)
    for handler in (ours, theirs):
        handler.setFormatter(formatter)
    ours.addFilter(lambda record: debug or is_rlcore(record.name))
    theirs.addFilter(lambda record: not debug and not is_rlcore(record.name))
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(ours)
    root.addHandler(theirs)
    root.setLevel(numeric if rank == 0 else logging.WARNING)
    for name in LIBRARIES_QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)


def is_rlcore(name: str) -> bool:
    return name == "rlcore" or name.startswith("rlcore.") or name == "__main__"
