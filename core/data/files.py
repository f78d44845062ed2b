"""Taskset files by their name: the data format (`.jsonl`, `.json`, `.parquet`, `.csv`) and an
optional compression around it (`.gz`, `.bz2`, `.xz`: `tasks.jsonl.gz`), read with the standard
library's openers (the checker) or by `datasets`, which infers the same compression."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from collections.abc import Callable
from typing import IO, Any

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""Data extension -> the `datasets` builder that reads it."""
COMPRESSIONS: dict[str, Callable[..., IO[Any]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
"""Compression extension -> its opener (text files only: parquet compresses itself)."""


def file_format(path: str) -> tuple[str, str]:
    """(data extension, compression extension or "") of a file: `a/tasks.jsonl.gz` -> (".jsonl", ".gz")."""
    root, ext = os.path.splitext(path.lower())
    if ext in COMPRESSIONS:
        return os.path.splitext(root)[1], ext
    return ext, ""


def supported(path: str) -> bool:
    data, compression = file_format(path)
    return data in FORMATS and not (compression and data == ".parquet")


def describe_formats() -> str:
    return f"{', '.join(FORMATS)}, each text one also as {', '.join(COMPRESSIONS)}"


def open_text(path: str, **kwargs: Any) -> IO[str]:
    """The file for reading as text, decompressed when its name says it is compressed."""
    opener = COMPRESSIONS.get(file_format(path)[1])
    return opener(path, "rt", **kwargs) if opener else open(path, **kwargs)  # noqa: SIM115
