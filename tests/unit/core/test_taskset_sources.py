"""Where taskset rows come from besides files: `save_to_disk` folders (a Dataset, a DatasetDict and
its split) and Hub ids (offline here: a one-line error naming the id, subset and split)."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from rlcore.core.config.schema import TasksetConfig
from rlcore.core.data.dataset_files import is_hub_id
from rlcore.core.data.taskset import load_tasks

ROWS = {"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}


def test_save_to_disk_folders_load_as_tasks(tmp_path: Path) -> None:
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(tmp_path / "ds"))
    tasks = load_tasks(TasksetConfig(name="d", path=str(tmp_path / "ds")), "taskset")
    assert [(t.prompt, t.answer, t.source) for t in tasks] == [("1+1=", "2", "d"), ("2+2=", "4", "d")]
    both = datasets.DatasetDict({"train": datasets.Dataset.from_dict(ROWS), "test": datasets.Dataset.from_dict({k: v[:1] for k, v in ROWS.items()})})
    both.save_to_disk(str(tmp_path / "dd"))
    assert len(load_tasks(TasksetConfig(name="d", path=str(tmp_path / "dd"), split="test"), "taskset")) == 1
    with pytest.raises(ValueError, match=r"^taskset\.split: 'dev' is not a split of .*; its splits: train, test$"):
        load_tasks(TasksetConfig(name="d", path=str(tmp_path / "dd"), split="dev"), "taskset")


def test_hub_ids_are_recognised_and_an_unreachable_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_hub_id("openai/gsm8k") and not is_hub_id("data/train.jsonl") and not is_hub_id("train")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cfg = TasksetConfig(name="g", path="rlcore-test/no-such-dataset", subset_name="main", split="test")
    with pytest.raises(ValueError) as e:
        load_tasks(cfg, "buffer.explorer_input.taskset")
    message = str(e.value)
    assert message.startswith(
        "buffer.explorer_input.taskset.path: cannot load 'rlcore-test/no-such-dataset' (subset 'main', split 'test') "
        "from the Hugging Face Hub: "
    ) and "\n" not in message


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "folder"])
def test_a_taskset_on_disk_loads_without_reaching_the_network(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """datasets' packaged builders (json, parquet...) send a HEAD request to its download counter on
    every load; a taskset on disk is read without one (no host name is even looked up)."""
    import socket

    ds = datasets.Dataset.from_dict(ROWS)
    path = {"jsonl": tmp_path / "t.jsonl", "parquet": tmp_path / "t.parquet", "folder": tmp_path / "files"}[kind]
    if kind == "jsonl":
        ds.to_json(str(path))
    elif kind == "parquet":
        ds.to_parquet(str(path))
    else:
        path.mkdir()
        ds.to_json(str(path / "part-0.jsonl"))
    looked_up: list[str] = []
    real = socket.getaddrinfo

    def recording(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        looked_up.append(str(host))
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)  # datasets' default
    tasks = load_tasks(TasksetConfig(name="d", path=str(path)), "taskset")
    assert [t.answer for t in tasks] == ["2", "4"]
    assert looked_up == []
    assert datasets.config.HF_UPDATE_DOWNLOAD_COUNTS is True  # the setting is back as it was
