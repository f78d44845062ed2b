"""Disk full under the file buffer, then space freed and both launches resumed: every group trained
exactly once. A decoupled run (`rlcore launch cfg mode=train` and `mode=explore`) whose buffer
folder is a small tmpfs (root only; skipped otherwise) is filled mid-run: the explore launch stops
in one line naming the buffer, its file and the fix; the trainer stops on its ledger the same way,
or waits for the explorer and is stopped (Ctrl-C); the space freed, both are resumed with
continue_from_checkpoint=true, and the buffer's files and ledger and the trainer's metrics count
every task's group put once and trained once."""

from __future__ import annotations

import glob
import json
import os
import signal
import time

import pytest

from tests.integration.launch_utils import read_metrics
from tests.integration.test_decoupled_launch import (
    GROUP,
    _config,
    _finish,
    _lines,
    _start,
    _wait_for_the_run_lock,
)
from tests.unit.buffer.full_disk import fill, small_disk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

STEPS = 6
FIX = (
    "No space left on device: free space there, then resume the {} launch with continue_from_checkpoint=true"
)


def _until_trained(run_dir: str, steps: int, *procs) -> None:
    deadline = time.monotonic() + 240
    while len([m for m in _lines(run_dir) if "buffer/experiences" in m]) < steps:
        for p in procs:
            assert p.poll() is None, p.communicate()[0][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _error_line(out: str) -> str:
    errors = [line for line in out.splitlines() if line.startswith("rlcore: error: ")]
    assert len(errors) == 1, out[-3000:]
    return errors[0]


def test_disk_full_under_the_file_buffer_then_freed_and_both_resumed(tmp_path) -> None:
    root = str(tmp_path)
    run_dir = os.path.join(root, "it", "run")
    with small_disk(os.path.join(root, "disk"), 1024) as disk:
        folder = os.path.join(disk, "buffer")
        path = _config(root, "file", **{
            "buffer.total_steps": STEPS, "trainer.save_interval": 1,
            "buffer.trainer_input.experience_buffer.path": folder,
        })  # fmt: skip
        trainer, explorer = _start(path, "train"), _start(path, "explore")
        procs = [trainer, explorer]
        try:
            _until_trained(run_dir, 1, trainer, explorer)
            filler = fill(disk)
            out, _ = explorer.communicate(timeout=240)
            said = _error_line(out)
            assert explorer.returncode != 0 and "\n" not in said
            assert (
                said.startswith(
                    f"rlcore: error: experience buffer 'experiences' (file {folder}): a put of 4 group(s) failed and "
                    "kept none of them: writing writers/explorer-"
                )
                and FIX.format("explore") in said
            ), said
            os.remove(filler)
            if trainer.poll() is None:  # it waits for the explorer: stopped (Ctrl-C), to resume both
                trainer.send_signal(signal.SIGINT)
            trained = trainer.communicate(timeout=120)[0]
            if trainer.returncode not in (0, 130):  # it met the full disk on its ledger
                assert (
                    "was not recorded in steps.jsonl" in _error_line(trained)
                    and FIX.format("train") in trained
                )
            for launch in (run_dir, os.path.join(run_dir, "explorer")):
                _wait_for_the_run_lock(os.path.join(launch, "launch", "owner.lock"))
            trainer = _start(path, "train", "continue_from_checkpoint=true")
            explorer = _start(path, "explore", "continue_from_checkpoint=true")
            procs = [trainer, explorer]
            explored = _finish(explorer, "the resumed mode explore")
            _finish(trainer, "the resumed mode train")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        assert "groups had not reached" in explored and "exploring it again" in explored, explored[-3000:]
        _each_group_put_and_trained_once(folder, run_dir)


def _each_group_put_and_trained_once(folder: str, run_dir: str) -> None:
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))  # the retrained ones replaced
    assert all(m["buffer/experiences"] == 4 * GROUP for m in train)
    written: dict[tuple[str, int], str] = {}  # (writer, line) -> its task
    for part in glob.glob(os.path.join(folder, "writers", "*.jsonl")):
        writer = os.path.basename(part).removesuffix(".jsonl")
        with open(part) as f:
            lines = f.read().split("\n")[:-1]  # whole lines: the failed put was cut
        written.update(
            {(writer, i): json.loads(line)["group"][0]["group_id"] for i, line in enumerate(lines)}
        )
    assert len(written) == len(set(written.values())) == 4 * STEPS, sorted(written.values())  # each task once
    with open(os.path.join(folder, "steps.jsonl")) as f:
        ledger = [json.loads(line) for line in f]
    taken = [(w, i) for step in ledger for w, i in step["groups"]]
    assert [s["step"] for s in ledger] == list(range(STEPS))
    assert len(taken) == len(set(taken)) == 4 * STEPS and set(taken) == set(written)  # each group once
