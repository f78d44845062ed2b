"""A trainer rank's log records: rlcore's on stdout, the libraries' on stderr (the run's trainer.log)
unless log.level is DEBUG."""

from __future__ import annotations

import logging

import pytest

from rlcore.runtime import rank_logs


@pytest.fixture()
def restore_root():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def emit() -> None:
    logging.getLogger("rlcore.runtime.loop").info("step 1 done")
    logging.getLogger("megatron.core.distributed").info("Params for bucket 1 (4 parameters)")
    logging.getLogger("torch.distributed").warning("a library warning")


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_library_records_go_to_stderr_unless_debug(level: str, capsys, restore_root) -> None:
    rank_logs.configure(0, level)
    emit()
    out, err = capsys.readouterr()
    assert "step 1 done" in out and "[rank0]" in out
    library = ("Params for bucket 1", "a library warning")
    if level == "DEBUG":
        assert all(text in out for text in library) and err == ""
    else:
        assert all(text in err for text in library) and not any(text in out for text in library)


def test_other_ranks_log_warnings_only(capsys, restore_root) -> None:
    rank_logs.configure(1, "INFO")
    emit()
    out, err = capsys.readouterr()
    assert out == "" and "a library warning" in err and "bucket" not in err
