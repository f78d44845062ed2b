"""Where a taskset's rows come from: a file, a folder `datasets` reads, or a Hugging Face Hub id."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config.schema import TasksetConfig
from .files import FORMATS, describe_formats, file_format, supported

__all__ = ["is_hub_id", "load_dataset_of", "readable_now"]


def is_hub_id(path: str) -> bool:
    """A Hugging Face Hub dataset id ('org/name'): not on disk, no file extension."""
    return (
        not os.path.exists(path)
        and re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None
        and not supported(path)
    )


def readable_now(cfg: TasksetConfig) -> bool:
    """Whether the taskset's rows can be read before the run starts: its file or folder is there,
    or it is a Hub id (a generator's path, not written yet, is neither)."""
    return os.path.exists(cfg.path) or (cfg.generator is None and is_hub_id(cfg.path))


def load_dataset_of(cfg: TasksetConfig, key_path: str) -> Any:
    """The taskset's rows as a `datasets.Dataset`: a file (jsonl, json, parquet, csv), a folder
    written by `save_to_disk` (a Dataset, or a DatasetDict and `split`), a folder of data files,
    or a Hub id with `subset_name` and `split`."""
    if is_hub_id(cfg.path):
        return _from_hub(cfg, key_path)
    with _no_download_count():
        return _from_disk(cfg, key_path)


_COUNTER = threading.Lock()


@contextmanager
def _no_download_count() -> Iterator[None]:
    """datasets sends a HEAD request to its download counter on every load through a packaged
    builder (json, parquet, csv...), a local file's too: a launch would reach the network twice (up
    to 3 s each on a slow link) to read files on disk. The setting is process-wide: loads from disk
    take turns (a thread's load would otherwise put it back under another's)."""
    import datasets

    with _COUNTER:
        before = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
        try:
            yield
        finally:
            datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = before


def _from_disk(cfg: TasksetConfig, key_path: str) -> Any:
    import datasets

    path = cfg.path
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(
            os.path.join(path, "state.json")
        ):
            ds = datasets.load_from_disk(path)
            if isinstance(ds, datasets.DatasetDict):
                if cfg.split not in ds:
                    raise ValueError(
                        f"{key_path}.split: '{cfg.split}' is not a split of {path}; its splits: {', '.join(ds)}"
                    )
                ds = ds[cfg.split]
            return ds
        return datasets.load_dataset(path, cfg.subset_name, split=cfg.split)
    if not supported(path):
        raise ValueError(f"{key_path}.path: unsupported file type of {path}; use one of {describe_formats()}")
    return datasets.load_dataset(FORMATS[file_format(path)[0]], data_files={cfg.split: path}, split=cfg.split)


def _from_hub(cfg: TasksetConfig, key_path: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(cfg.path, cfg.subset_name, split=cfg.split)
    except Exception as e:  # no network, unknown id, subset or split: one line
        what = f"subset '{cfg.subset_name}', " if cfg.subset_name else ""
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"{key_path}.path: cannot load '{cfg.path}' ({what}split '{cfg.split}') from the Hugging Face Hub: {message}"
        ) from None
