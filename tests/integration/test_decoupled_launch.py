"""A decoupled run: `rlcore launch cfg mode=train` and `rlcore launch cfg mode=explore` at the same
time, joined by the experience buffer (each storage in turn): the explorer writes every step's
groups tagged with the version of the weights it holds, the trainer trains on them and publishes its
weights, which the explorer loads (staleness bounded by synchronizer.max_staleness). Every
experience is trained once, also across a trainer killed and resumed from its checkpoint (counted)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from rlcore.client import ClientOptions, RolloutClient
from rlcore.weights.publish import registered_receivers
from tests.integration.launch_utils import REPO, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 5
GROUP = 4  # algorithm.repeat_times


def _config(root: str, storage: str, **more) -> str:
    cfg = tiny_grpo_config(
        root,
        **{
            "buffer.total_steps": STEPS, "synchronizer.max_staleness": 1,
            "buffer.trainer_input.experience_buffer.storage_type": storage,
            "buffer.trainer_input.experience_buffer.max_wait_s": 240,
            **more,
        },
    )  # fmt: skip
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def _start(path: str, mode: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path, f"mode={mode}", *overrides],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """The launch's output as it comes, up to a chunk holding `text` (read from the pipe itself:
    a later `_finish` reads the rest)."""
    import select

    fd, got = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while text.encode() not in got:
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{got.decode()[-3000:]}"
        if select.select([fd], [], [], 0.5)[0]:
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"the launch ended without {text!r}:\n{got.decode()[-3000:]}"
            got += chunk
    return got.decode(errors="replace")


def _finish(proc: subprocess.Popen, what: str, timeout_s: float = 400) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out[-5000:]}"
    return out


def _check_run(run_dir: str, trained_steps: int = STEPS, staleness: int = 1) -> tuple[list[dict], list[dict]]:
    """The trainer's and the explorer's step records, after checking what both launches agree on;
    `staleness`: the most the trainer's experiences may lag (a task left running by over-rollout
    reaches the trainer a step after max_staleness allows for the step that sent it)."""
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    explore = read_metrics(os.path.join(run_dir, "explorer"))
    assert [m["step"] for m in train] == list(range(1, trained_steps + 1))
    assert all(m["buffer/experiences"] == 4 * GROUP for m in train)  # buffer.batch_size whole groups
    assert sum(m["buffer/experiences"] for m in train) == sum(m["buffer/experiences_put"] for m in explore)
    versions = [m["rollout/policy_version"] for m in explore]
    assert versions == sorted(versions) and versions[-1] >= trained_steps - 2, (
        versions
    )  # the trainer's weights came
    for step, version in enumerate(versions):  # never more than max_staleness steps behind
        assert step - version <= 1
    assert all(m["rollout/staleness_mean"] <= staleness for m in train), [
        m["rollout/staleness_mean"] for m in train
    ]
    return train, explore


SLOW_TAIL = {  # a quarter of the tasks wait a second after generating; steps leave one task running
    "buffer.explorer_input.taskset.default_workflow_type": "rlcore.benchmarks.long_tails:SlowTailWorkflow",
    "buffer.explorer_input.taskset.workflow_args": {"slow_fraction": 0.25, "slow_s": 1.0},
    "explorer.over_rollout.ratio": 0.25,
    "explorer.dynamic_timeout.enable": True, "explorer.dynamic_timeout.ratio": 100.0,  # on, cuts nothing
}  # fmt: skip


def test_an_explore_and_a_train_launch_meet_in_the_buffer_and_a_killed_explore_worker_comes_back(tmp_path) -> None:
    """The queue storage (file: with the explorer killed and resumed below; sql: the trainer's). The
    explore launch has 2 rollout workers, one killed (-9) once the explorer holds version 4: the next
    load goes to the other one; the launch restarts the killed one from the newest published weights
    (the folder both started from is pruned by then), and the explorer takes it in and loads the
    newest weights into both before its next tasks; every step trains."""
    from tests.integration.test_worker_failover import _read, _until, _worker

    root, steps = str(tmp_path), 40
    path = _config(root, "queue", **{
        "buffer.total_steps": steps, "buffer.total_epochs": 3, "explorer.rollout_model.engine_num": 2,
    })  # fmt: skip
    trainer = _start(path, "train")
    explorer = subprocess.Popen(  # it waits for the trainer's first weights
        [sys.executable, "-m", "rlcore.cli", "launch", path, "mode=explore"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    (out, errs), readers = _read(explorer)
    _until(lambda: max(_held(out), default=-1) >= 4, "the explorer to hold version 4", explorer)
    started = next(line for line in out if "rollout workers ready: " in line).split("ready: ")[1].strip().split(", ")
    _worker(root, 1).kill()
    explorer.wait(timeout=300)
    for r in readers:
        r.join(timeout=10)
    text = "".join(out)
    assert explorer.returncode == 0, text[-3000:] + "\n" + "".join(errs)[-3000:]  # a str: shown whole
    assert "explore only, rollout on cpu (the trainer runs in its own launch)" in text, text[-3000:]
    assert "trainer rank" not in text.split("run folder")[0]
    _finish(trainer, "mode train")
    joined = [i for i, line in enumerate(out) if "rollout workers now: " in line]
    assert joined, text[-4000:]
    now = out[joined[-1]].split("rollout workers now: ")[1].split(" (were")[0].split(", ")
    assert len(now) == 2 and started[1] not in now and started[0] in now, out[joined[-1]]
    after = _held(out[joined[-1] :])
    assert after and after[0] >= 4, (after, text[-4000:])  # both loaded the newest before the next tasks
    log = open(os.path.join(root, "it", "run", "explorer", "launch", "rollout_worker_1.log")).read()
    restarted_from = [line.split("serving ")[1].split(" on ")[0] for line in log.splitlines() if "serving" in line]
    assert len(restarted_from) == 2 and not restarted_from[1].endswith("version_0"), restarted_from
    _check_run(os.path.join(root, "it", "run"), steps)


def test_an_explore_launch_whose_only_worker_dies_waits_for_its_restart(tmp_path) -> None:
    """One rollout worker, killed (-9) once the explorer holds version 3: the step it was exploring
    fails on no worker at all; the explorer waits for the launch to restart it, loads the newest
    weights into it and explores the step again; every step trains."""
    from tests.integration.test_worker_failover import _read, _until, _worker

    root, steps = str(tmp_path), 12
    path = _config(root, "file", **{"buffer.total_steps": steps})
    trainer = _start(path, "train")
    explorer = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", path, "mode=explore"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    (out, errs), readers = _read(explorer)
    _until(lambda: max(_held(out), default=-1) >= 3, "the explorer to hold version 3", explorer)
    _worker(root, 0).kill()
    explorer.wait(timeout=300)
    for r in readers:
        r.join(timeout=10)
    text = "".join(out)
    assert explorer.returncode == 0, text[-3000:] + "\n" + "".join(errs)[-3000:]
    _finish(trainer, "mode train")
    # noticed in the weight load or in the rollout, whichever met the dead worker first
    assert "no rollout worker answers: waiting up to" in text and "rollout workers now: " in text, text[-3000:]
    _check_run(os.path.join(root, "it", "run"), steps)


def _held(lines: list[str]) -> list[int]:
    """The versions an explorer said its rollout workers hold, in order."""
    return [int(line.split("hold version ")[1].split()[0]) for line in lines if "the rollout workers hold version" in line]


def _pushed(out: str) -> list[int]:
    """The steps whose weights a trainer pushed to the explorer's workers over a group."""
    return [int(line.split("weights of step ")[1].split()[0]) for line in out.splitlines() if "over a group" in line]


def test_a_trainer_killed_and_resumed_trains_every_experience_once(tmp_path) -> None:
    """With the weights pushed over a group (synchronizer.sync_method nccl): the first version is a
    folder the explore launch's workers start from, later ones go over a gloo group to the workers
    the explorer registered; the resumed trainer's first version is a folder again, which the
    explorer loads as the newest, then pushes resume. The staleness rule holds as with folders.
    The kill comes with the workers paused, as a push it cuts leaves them: an explorer that then
    explores finds them paused but answering, and waits for newer weights, watching the trainer
    (it once took them for dead and waited minutes for a restart, blind to the trainer)."""
    import re

    steps = 8
    path, run_dir, trainer, explorer = _past_the_step_2_checkpoint(tmp_path, steps, **{"synchronizer.sync_method": "nccl"})
    _pause_the_workers(run_dir)  # as a push the kill cuts leaves them: paused until the next version
    trainer.kill()  # the launcher only: its trainer world dies with it
    before = trainer.communicate()[0]
    # the trainer starts again once the explorer saw it gone (a restart may take less than a second)
    gone = _read_until(explorer, "the mode-train launch of this run is gone", timeout_s=120)
    resumed = _start(path, "train", "continue_from_checkpoint=true")
    explored = gone + _finish(explorer, "mode explore")
    # it watched the trainer launch's lock: said when it went and when it came back, and waited
    assert "the mode-train launch of this run is gone: its lock" in explored, explored[-3000:]
    assert "the mode-train launch of this run is back" in explored, explored[-3000:]
    out = _finish(resumed, "the resumed mode train")
    found = re.search(r"resumed main from \S+ \(step (\d+)\)", out)
    assert found and int(found.group(1)) < steps, out[-3000:]  # it retrains the steps after its checkpoint
    first, later = _pushed(before), _pushed(out)
    resumed_at = int(found.group(1))
    assert first[:2] == [1, 2] and later and later[0] >= resumed_at, (first, later, out[-3000:])
    assert "could not push" not in before + out and "(pushed over a group)" in explored, out[-3000:]
    # folders (the newest 3 kept): the first version, the resumed trainer's first, and those the
    # trainer published after the explorer finished
    folders = {int(n.split("_")[1]) for d, names, _ in os.walk(run_dir) for n in names
               if n.startswith("version_") and "published" in d}  # fmt: skip
    assert resumed_at in folders and all(v > later[-1] for v in folders - {0, resumed_at}), (folders, later)
    train, _ = _check_run(run_dir, steps)  # every step once in the metrics: the retrained ones replaced
    _each_group_trained_once(run_dir, train, steps)


def test_a_restarted_trainer_world_resumes_the_buffer_and_trains_every_experience_once(tmp_path) -> None:
    """trainer.max_restarts in a decoupled run: the train launch's rank killed (-9) past its step-2
    checkpoint fails its world; the launch starts it again, the ranks resume from the checkpoint,
    the buffer's read position included, while the explore launch keeps exploring; every step is
    logged once and every group is taken by one step only (the buffer's ledger, counted)."""
    from tests.integration.quickstart_runs import trainer_rank

    steps = 8
    _, run_dir, trainer, explorer = _past_the_step_2_checkpoint(
        tmp_path, steps, **{"trainer.max_restarts": 1}
    )
    trainer_rank(str(tmp_path), 0).kill()
    _finish(explorer, "mode explore")
    out = _finish(trainer, "the restarted mode train")
    assert "restart 1 of 1 (trainer.max_restarts) from the last checkpoint" in out, out[-3000:]
    assert "trainer world restart 1 of 1 (trainer.max_restarts): resuming from the last checkpoint" in out
    train, _ = _check_run(run_dir, steps)  # every step once in the metrics: the retrained ones replaced
    _each_group_trained_once(run_dir, train, steps)


def _past_the_step_2_checkpoint(
    tmp_path, steps: int, **more
) -> tuple[str, str, subprocess.Popen, subprocess.Popen]:
    """A decoupled run on the sql storage, checkpointing every 2 steps, once its trainer logged step
    3: its config, run folder, and train and explore launches."""
    path = _config(str(tmp_path), "sql", **{"trainer.save_interval": 2, "buffer.total_steps": steps, **more})
    run_dir = os.path.join(str(tmp_path), "it", "run")
    trainer = _start(path, "train")
    explorer = _start(path, "explore")
    deadline = time.monotonic() + 300
    while len([m for m in _lines(run_dir) if "buffer/experiences" in m]) < 3:
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()[0][-3000:]
        time.sleep(0.2)
    return path, run_dir, trainer, explorer


def _pause_the_workers(run_dir: str) -> None:
    """Pause the explore launch's rollout workers (those it registered for the trainer's pushes)."""
    folder = os.path.join(run_dir, "published")
    deadline = time.monotonic() + 60
    while not (registered := registered_receivers(folder))[0]:
        assert time.monotonic() < deadline, f"the explorer registered no workers in {folder}: {os.listdir(folder)}"
        time.sleep(0.2)
    workers, _, token = registered
    for address in workers:
        with RolloutClient(address, ClientOptions(token=token)) as client:
            client.pause()


def _each_group_trained_once(run_dir: str, train: list[dict], steps: int) -> None:
    """The sql buffer's ledger: every step once, each group taken by one step only, none left."""
    import sqlite3

    with sqlite3.connect(os.path.join(run_dir, "buffer", "experiences.db")) as db:
        ledger = db.execute("SELECT step, group_key FROM rlcore_buffer_steps").fetchall()
        written = db.execute("SELECT COUNT(DISTINCT group_key) FROM rlcore_experiences").fetchone()[0]
    taken = [key for _, key in ledger]
    assert len({step for step, _ in ledger}) == steps
    assert len(taken) == len(set(taken)) == written == 4 * steps
    assert sum(m["buffer/experiences"] for m in train) == 4 * steps * GROUP


def _lines(run_dir: str) -> list[dict]:
    try:
        return read_metrics(run_dir)
    except (FileNotFoundError, ValueError):
        return []


def test_dpo_trains_on_the_pairs_an_explorer_forms(tmp_path) -> None:
    """algorithm.dpo.pairs buffer: the explore launch writes each task's best and worst responses as
    a pair (two tasks in five reward every response alike and give none), the train launch trains
    DPO on them, 4 pairs a step, until the explorer finishes; each pair once (the sql buffer's
    ledger). The 12 pairs fill 3 steps exactly: the trainer's fourth take finds the buffer read to
    its end, and ends the stage without a row of its own."""
    import sqlite3

    path = _config(str(tmp_path), "sql", **{
        "algorithm.algorithm_type": "dpo", "algorithm.dpo.pairs": "buffer", "algorithm.dpo.beta": 0.5,
        "buffer.explorer_input.taskset.reward_fn": ["tests.integration.rewards:two_in_five_constant"],
        "buffer.explorer_input.taskset.generator_args.num_tasks": 4 * STEPS,  # each task explored once
    })  # fmt: skip
    run_dir = os.path.join(str(tmp_path), "it", "run")
    trainer = _start(path, "train")
    _finish(_start(path, "explore"), "mode explore")
    _finish(trainer, "mode train")
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    explore = read_metrics(os.path.join(run_dir, "explorer"))
    pairs = sum(m["buffer/groups_put"] for m in explore)
    tied = sum(m["buffer/groups_tied"] for m in explore)
    assert (pairs, tied) == (12, 8)  # a multiple of the batch: the case of an empty last take
    assert [m["step"] for m in train] == [1, 2, 3]
    assert sum(m["buffer/experiences"] for m in train) == 2 * pairs  # every pair, chosen and rejected
    assert abs(train[0]["dpo/loss"] - 0.693147) < 1e-4  # the reference is the starting policy
    with sqlite3.connect(os.path.join(run_dir, "buffer", "experiences.db")) as db:
        taken = [key for (key,) in db.execute("SELECT group_key FROM rlcore_buffer_steps")]
    assert len(taken) == len(set(taken)) == pairs
    # launched again, the trainer resumes from its final checkpoint at the buffer's next step (the
    # empty take is no step in the sql ledger), finds it read to its end and ends, logging nothing
    logged = read_metrics(run_dir)
    _finish(_start(path, "train", "continue_from_checkpoint=true"), "mode train, resumed")
    assert read_metrics(run_dir) == logged


def test_asynchronous_both_explores_ahead_in_one_launch_and_restarts_its_failed_explorer(tmp_path) -> None:
    """The explorer thread's workflow fails once, at its third call (a fault the explorer cannot
    retry): the thread is restarted from its saved position and the run still trains every step on
    every task's group once."""
    from tests.integration.launch_utils import heldout_taskset, launch

    root = str(tmp_path)
    marker = os.path.join(root, "failed_once")
    cfg = tiny_grpo_config(
        root,
        **{
            "buffer.total_steps": STEPS, "synchronizer.asynchronous": True, "synchronizer.max_staleness": 2,
            "buffer.explorer_input.eval_tasksets": [heldout_taskset(root, 8)], "explorer.eval_interval": 2,
            "buffer.explorer_input.taskset.default_workflow_type": "tests.integration.workflows:FailsOnceWorkflow",
            "buffer.explorer_input.taskset.workflow_args": {"marker": marker, "at_call": 3},
        },
    )  # fmt: skip
    proc = launch(cfg, os.path.join(root, "cfg.yaml"))
    assert os.path.exists(marker)  # the fault happened
    said = proc.stdout + proc.stderr + proc.trainer_log  # type: ignore[attr-defined]
    assert "the explorer thread failed at explore step" in said, said[-3000:]
    failed = next(line for line in said.splitlines() if "the explorer thread failed at explore step" in line)
    assert "injected failure" in failed and "restarting it in 1 s (1 of 3, explorer.max_restarts)" in failed, failed
    run_dir = os.path.join(root, "it", "run")
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    explore = read_metrics(os.path.join(run_dir, "explorer"))
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))
    assert all(m["buffer/experiences"] == 4 * GROUP for m in train)
    assert sum(m["buffer/experiences_put"] for m in explore) == 4 * GROUP * STEPS
    versions = [m["rollout/policy_version"] for m in explore]
    assert versions == sorted(versions) and versions[-1] >= STEPS - 3, versions
    assert all(step - v <= 2 for step, v in enumerate(versions))  # max_staleness
    assert all(m["rollout/staleness_mean"] <= 2 for m in train)
    assert any("eval/heldout/accuracy" in m for m in read_metrics(run_dir))  # on the trainer's own engine


def test_an_explorer_killed_and_resumed_sends_its_running_tasks_again(tmp_path) -> None:
    """The file storage, with a slow tail and over-rollout: the explore launch is killed (-9) once
    its saved position holds a task still running, and started again: it sends that task again, and
    the trainer trains every task's group once (counted in the buffer's files)."""
    import glob
    import json

    steps = 6
    path = _config(str(tmp_path), "file", **SLOW_TAIL, **{"buffer.total_steps": steps})
    run_dir = os.path.join(str(tmp_path), "it", "run")
    state_file = os.path.join(run_dir, "explorer", "explorer_state.json")
    trainer = _start(path, "train")
    explorer = _start(path, "explore")
    deadline = time.monotonic() + 300
    while True:
        assert explorer.poll() is None and time.monotonic() < deadline, explorer.communicate()[0][-3000:]
        try:
            with open(state_file) as f:
                state = json.load(f)
        except (FileNotFoundError, ValueError):
            state = {}
        if state.get("running") and state["explore_step"] < steps - 1:
            break
        time.sleep(0.05)
    explorer.kill()  # the launcher only: its rollout workers end with it
    explorer.communicate()
    _wait_for_the_run_lock(os.path.join(run_dir, "explorer", "launch", "owner.lock"))
    # the explorer starts again once the trainer saw it gone (on a warm fork server a restart takes
    # a second, which the trainer, busy with a step, may not look at the lock within)
    gone = _read_until(trainer, "the explore launch of this run is gone", timeout_s=120)
    resumed = _start(path, "explore", "continue_from_checkpoint=true")
    out = _finish(resumed, "the resumed mode explore")
    trained = gone + _finish(trainer, "mode train")
    assert "the explore launch of this run is gone: its lock" in trained, trained[-3000:]
    assert "that were still running are sent again" in out, out[-3000:]
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    assert [m["step"] for m in train] == list(range(1, steps + 1))
    # tasks left running are trained too (algorithm.sample_strategy default), a step later at most
    assert all(m.get("rollout/stale_dropped", 0) == 0 and m["rollout/staleness_mean"] <= 2 for m in train)
    from rlcore.buffer import open_buffer
    from rlcore.core.config import load_config, resolve_stages

    stats = open_buffer(resolve_stages(load_config(path, ["mode=train"]))[0].config).stats()
    assert stats.groups_written == stats.groups_taken == 4 * steps and stats.available == 0
    assert stats.writers == 2 and stats.writers_finished == 1  # the killed explorer never finished
    written = []
    for part in glob.glob(os.path.join(run_dir, "buffer", "experiences", "writers", "*.jsonl")):
        with open(part) as f:
            written += [json.loads(line)["group"] for line in f if line.endswith("\n")]
    keys = [group[0]["group_id"] for group in written]
    assert len(keys) == len(set(keys)) == 4 * steps, sorted(keys)  # every task once, none lost
    assert sum(m["buffer/experiences"] for m in train) == 4 * steps * GROUP


def _wait_for_the_run_lock(lock_file: str, timeout_s: float = 60.0) -> None:
    """Until the last process of a killed launch (its rollout workers) let go of the run's lock."""
    import fcntl

    deadline = time.monotonic() + timeout_s
    fd = os.open(lock_file, os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{lock_file} still held {timeout_s:g} s after the kill"
                time.sleep(0.2)
    finally:
        os.close(fd)


def test_an_explorer_waiting_for_weights_stops_on_sigint_within_the_grace(tmp_path) -> None:
    """The trainer's rank is frozen (SIGSTOP) once it trained a step, so the explorer soon waits for
    newer weights (max_staleness 1) while the trainer launch lives; Ctrl-C then stops it within
    seconds (its heartbeat carries the stop), not after control.stop_grace_s (60 s) without a final
    state. The trainer, thawed, then waits for experiences nobody writes: Ctrl-C stops it as soon."""
    import json
    import signal

    from tests.integration.quickstart_runs import trainer_rank

    path = _config(str(tmp_path), "file", **{"buffer.total_steps": 40})
    run_dir = os.path.join(str(tmp_path), "it", "run")
    state_file = os.path.join(run_dir, "explorer", "explorer_state.json")
    trainer = _start(path, "train")
    explorer = _start(path, "explore")
    rank = None
    try:
        metrics, deadline = os.path.join(run_dir, "metrics.jsonl"), time.monotonic() + 300
        while not (os.path.exists(metrics) and any("buffer/experiences" in m for m in read_metrics(run_dir))):
            assert trainer.poll() is None and explorer.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        rank = trainer_rank(str(tmp_path), 0)
        rank.suspend()
        last, still = None, 0.0
        while still < 3.0:  # the explorer's position stays put: it waits for weights
            assert explorer.poll() is None and time.monotonic() < deadline, explorer.communicate()[0][-3000:]
            try:
                with open(state_file) as f:
                    step = json.load(f)["explore_step"]
            except (FileNotFoundError, ValueError):
                step = None
            still = still + 0.25 if step is not None and step == last else 0.0
            last = step
            time.sleep(0.25)
        explorer.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, _ = explorer.communicate(timeout=120)
        assert time.monotonic() - start < 20, out[-3000:]
        assert explorer.returncode == 130 and "stop" in out, out[-3000:]
        # the trainer, thawed, soon waits for experiences nobody writes: Ctrl-C stops it within seconds too
        rank.resume()
        rank = None
        last, still = -1, 0.0
        while still < 3.0:  # its step stays put: it waits in the buffer
            assert trainer.poll() is None and time.monotonic() < deadline + 120
            steps = len(read_metrics(run_dir))
            still, last = (still + 0.25 if steps == last else 0.0), steps
            time.sleep(0.25)
        trainer.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, _ = trainer.communicate(timeout=120)
        assert time.monotonic() - start < 20 and trainer.returncode == 130, out[-3000:]
    finally:
        if rank is not None:
            rank.resume()
        for proc in (explorer, trainer):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

