"""Task history and difficulty filtering inside real launches, on a taskset where half the tasks are
always solved (tests.integration.rewards:solved_half gives every response to an even-numbered task
1.0, and less to the others): after its first epoch a lock-step run explores only the others, and a
run stopped at a checkpoint, or killed (-9) mid-run, and resumed draws and trains exactly what the
uninterrupted run does; a decoupled run's explorer (mode explore beside mode train) and an
asynchronous one filter too, and drop the groups that teach nothing before the buffer (dynamic
sampling, refused there before); a decoupled run's explore launch killed (-9) mid-run and started
again ends with the uninterrupted run's history and draws."""

from __future__ import annotations

import json
import os
import time

import pytest

from .launch_utils import launch, read_metrics, tiny_grpo_config
from .test_decoupled_launch import _config, _finish, _read_until, _start, _wait_for_the_run_lock

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SOLVED_HALF = {
    "buffer.explorer_input.taskset.reward_fn": ["tests.integration.rewards:solved_half"],
    "buffer.explorer_input.taskset.generator_args": {"num_tasks": 8, "max_operand": 9},  # 2 batches an epoch
    "buffer.total_epochs": 3,
    "buffer.explorer_input.task_selection": {"difficulty_filter": {"enable": True, "too_hard": None, "readmit_after": 100}},
}  # fmt: skip
"""Batches of 4 of 8 tasks: epoch 0 (steps 1-2) explores each once, then only the 4 odd-numbered."""

KEYS = ("tasks/skipped_easy", "tasks/pool_easy", "tasks/pool_open", "rollout/effective_groups", "rollout/reward_mean", "actor/loss")  # fmt: skip


def _steps(run_dir: str) -> list[dict]:
    return [m for m in read_metrics(run_dir) if "actor/loss" in m]


def _explored_tasks(run_dir: str) -> list[set[int]]:
    """The task numbers each step's completions came from."""
    steps: dict[int, set[int]] = {}
    with open(os.path.join(run_dir, "completions.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            steps.setdefault(row["step"], set()).add(int(row["group"].rsplit("-", 1)[1]))
    return [steps[s] for s in sorted(steps)]


def test_a_lockstep_run_skips_the_solved_half_and_resumes_its_history_exactly(tmp_path) -> None:
    logged = {"monitor.log_completions": True, "monitor.save_completions_probability": 1.0}
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch(tiny_grpo_config(straight, **{**SOLVED_HALF, **logged, "buffer.total_steps": 6}), straight + ".yaml")
    cfg = tiny_grpo_config(resumed, **{**SOLVED_HALF, **logged, "buffer.total_steps": 3})
    launch(cfg, resumed + ".yaml")
    launch(cfg, resumed + ".yaml", "buffer.total_steps=6", "continue_from_checkpoint=true")

    a, b = (os.path.join(r, "it", "run") for r in (straight, resumed))
    explored = _explored_tasks(a)
    assert sorted(explored[0] | explored[1]) == list(range(8))  # epoch 0: every task once
    assert all(s == {1, 3, 5, 7} for s in explored[2:]), explored  # then the solved half is skipped
    steps = _steps(a)
    skipped = [m.get("tasks/skipped_easy", 0) for m in steps]  # the even ones the walk passed over
    assert skipped[:2] == [0, 0] and all(n > 0 for n in skipped[2:]), skipped
    assert steps[-1]["tasks/pool_easy"] == 4 and steps[-1]["tasks/pool_open"] == 4
    assert _explored_tasks(b) == explored
    for x, y in zip(steps, _steps(b), strict=True):
        for key in KEYS:
            assert abs(x.get(key, 0) - y.get(key, 0)) < 1e-6, (x["step"], key, x.get(key), y.get(key))
    states = [json.load(open(os.path.join(r, "source_state", "step_6.json"))) for r in (a, b)]
    assert states[0] == states[1] and len(states[0]["task_selection"]["history"]) == 8


def test_a_lockstep_step_without_refill_explores_and_trains_only_the_open_tasks(tmp_path) -> None:
    """difficulty_filter.refill false: after epoch 0 a step explores only the open tasks of its 4
    turns (about half: the solved half is not explored at all) and trains on those groups alone."""
    logged = {"monitor.log_completions": True, "monitor.save_completions_probability": 1.0}
    selection = {"difficulty_filter": {"enable": True, "too_hard": None, "readmit_after": 100, "refill": False}}
    root = str(tmp_path)
    launch(tiny_grpo_config(root, **{**SOLVED_HALF, **logged, "buffer.total_steps": 6,
                                     "buffer.explorer_input.task_selection": selection}), root + ".yaml")  # fmt: skip
    run_dir = os.path.join(root, "it", "run")
    explored, steps = _explored_tasks(run_dir), _steps(run_dir)
    assert sorted(explored[0] | explored[1]) == list(range(8))  # epoch 0: every task once
    assert all(s and s <= {1, 3, 5, 7} for s in explored[2:]), explored  # then only open ones, fewer than 4
    drawn = [m["tasks/drawn"] for m in steps]
    assert drawn[:2] == [4, 4] and all(1 <= n < 4 for n in drawn[2:]) and sum(drawn[2:]) >= 4, drawn
    assert [len(s) for s in explored[2:]] == drawn[2:]  # each step trained on its drawn tasks' groups
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]


def test_a_decoupled_explorer_filters_and_drops_the_groups_that_teach_nothing(tmp_path) -> None:
    """mode explore + mode train over the file buffer, with dapo (dynamic sampling: each step's
    groups whose rewards are all equal are dropped and refilled before the put)."""
    root = str(tmp_path)
    path = _config(root, "file", **{**SOLVED_HALF, "algorithm.algorithm_type": "dapo", "buffer.total_steps": 4})
    trainer = _start(path, "train")
    explorer = _start(path, "explore")
    _finish(explorer, "mode explore")
    _finish(trainer, "mode train")
    run_dir = os.path.join(root, "it", "run")
    explore = read_metrics(os.path.join(run_dir, "explorer"))
    assert len(explore) == 4
    # every step puts 4 groups whose rewards differ: the solved ones were dropped (and others explored
    # in their place) in epoch 0, and skipped before they were explored after it
    assert [m["rollout/groups_kept"] for m in explore] == [4, 4, 4, 4]
    assert sum(m["rollout/groups_dropped"] for m in explore[:2]) > 0
    assert all(m.get("tasks/skipped_easy", 0) > 0 for m in explore[2:]), explore
    assert all(m["buffer/groups_put"] == 4 for m in explore)
    with open(os.path.join(run_dir, "explorer", "explorer_state.json")) as f:
        saved = json.load(f)
    assert saved["explore_step"] == 4 and len(saved["task_selection"]["history"]) == 8
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    assert [m["step"] for m in train] == [1, 2, 3, 4]


NO_REFILL = {"difficulty_filter": {"enable": True, "too_hard": None, "readmit_after": 100, "refill": False}}


def _each_trainer_step_is_one_explore_step(run_dir: str, steps: int) -> None:
    """Without refill: after epoch 0 an explore step explores only its open tasks (fewer than 4) and
    puts a place for each skipped one; each trainer step takes one explore step's 4 places and
    trains on its explored groups alone, as a lock-step step does."""
    explore = read_metrics(os.path.join(run_dir, "explorer"))
    drawn = [m["tasks/drawn"] for m in explore]
    assert drawn[:2] == [4, 4] and all(1 <= n < 4 for n in drawn[2:]), drawn
    assert [m["buffer/groups_put"] for m in explore] == drawn
    assert [m.get("buffer/skipped_places_put", 0) for m in explore] == [4 - n for n in drawn]
    train = [m for m in read_metrics(run_dir) if "buffer/experiences" in m]
    assert [m["step"] for m in train] == list(range(1, steps + 1))
    assert [m["buffer/groups"] for m in train] == drawn  # one explore step's open groups each
    assert [m.get("buffer/skipped_places", 0) for m in train] == [4 - n for n in drawn]
    assert [m["buffer/experiences"] for m in train] == [4 * n for n in drawn]  # repeat_times 4


def test_a_decoupled_step_without_refill_trains_on_one_explore_steps_open_tasks(tmp_path) -> None:
    root = str(tmp_path)
    path = _config(root, "sql", **{**SOLVED_HALF, "buffer.total_steps": 6, "buffer.explorer_input.task_selection": NO_REFILL})
    trainer = _start(path, "train")
    _finish(_start(path, "explore"), "mode explore")
    _finish(trainer, "mode train")
    _each_trainer_step_is_one_explore_step(os.path.join(root, "it", "run"), 6)


def test_an_asynchronous_step_without_refill_trains_on_one_explore_steps_open_tasks(tmp_path) -> None:
    root = str(tmp_path)
    cfg = tiny_grpo_config(root, **{
        **SOLVED_HALF, "buffer.total_steps": 6, "buffer.explorer_input.task_selection": NO_REFILL,
        "synchronizer.asynchronous": True, "synchronizer.max_staleness": 2,
    })  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    _each_trainer_step_is_one_explore_step(os.path.join(root, "it", "run"), 6)


def test_an_asynchronous_run_filters_in_its_explorer_thread(tmp_path) -> None:
    root = str(tmp_path)
    cfg = tiny_grpo_config(root, **{
        **SOLVED_HALF, "algorithm.algorithm_type": "dapo", "buffer.total_steps": 4,
        "synchronizer.asynchronous": True, "synchronizer.max_staleness": 2,
    })  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    run_dir = os.path.join(root, "it", "run")
    explore = read_metrics(os.path.join(run_dir, "explorer"))
    assert [m["rollout/groups_kept"] for m in explore] == [4, 4, 4, 4]
    assert all(m.get("tasks/skipped_easy", 0) > 0 for m in explore[2:]), explore
    state = json.load(open(os.path.join(run_dir, "source_state", "step_4.json")))
    assert len(state["explorer"]["task_selection"]["history"]) == 8
    assert [m["step"] for m in _steps(run_dir)] == [1, 2, 3, 4]


def test_a_lockstep_run_killed_mid_run_resumes_its_task_history_exactly(tmp_path) -> None:
    """SIGKILL to the whole launch once step 3's state is saved (checkpoints every step): the resumed
    run ends with the history, the draws and the metrics of the run never killed."""
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from .launch_utils import REPO

    settings = {**SOLVED_HALF, "trainer.save_interval": 1, "trainer.save_hf_checkpoint": "never", "buffer.total_steps": 6}
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    launch(tiny_grpo_config(straight, **settings), straight + ".yaml")
    cfg = tiny_grpo_config(killed, **settings)
    with open(killed + ".yaml", "w") as f:
        yaml.safe_dump(cfg, f)
    run_dir = os.path.join(killed, "it", "run")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "launch", killed + ".yaml"], cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not os.path.isfile(os.path.join(run_dir, "source_state", "step_3.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the launch ended before step 3's state"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert not os.path.isfile(os.path.join(run_dir, "source_state", "step_6.json"))  # killed before its end
    launch(cfg, killed + ".yaml", "continue_from_checkpoint=true")

    a = os.path.join(straight, "it", "run")
    states = [json.load(open(os.path.join(r, "source_state", "step_6.json"))) for r in (a, run_dir)]
    assert states[0] == states[1] and len(states[0]["task_selection"]["history"]) == 8
    last = {m["step"]: m for m in _steps(run_dir)}  # a step retrained after the kill is logged again
    assert sorted(last) == [1, 2, 3, 4, 5, 6]
    for x in _steps(a):
        for key in KEYS:
            assert abs(x.get(key, 0) - last[x["step"]].get(key, 0)) < 1e-6, (x["step"], key)


def _decoupled_run(root: str, kill_at: int | None = None) -> tuple[dict, list[dict]]:
    """A decoupled run (mode explore + mode train) of 6 steps with the steady half-solved reward;
    `kill_at`: its explore launch is killed (-9) once its saved position is explore step `kill_at`,
    then started again with continue_from_checkpoint. (the saved task selection, the explorer's
    metrics by step: a step explored again after the kill counts once, as explored last)"""
    steps = 6
    settings = {**SOLVED_HALF, "buffer.explorer_input.taskset.reward_fn": ["tests.integration.rewards:solved_half_steady"],
                "buffer.total_steps": steps}  # fmt: skip
    os.makedirs(root, exist_ok=True)
    path = _config(root, "file", **settings)
    run_dir = os.path.join(root, "it", "run")
    state_file = os.path.join(run_dir, "explorer", "explorer_state.json")
    trainer, explorer = _start(path, "train"), _start(path, "explore")
    if kill_at is not None:
        deadline = time.monotonic() + 300
        while _saved_step(state_file) < kill_at:
            assert explorer.poll() is None and time.monotonic() < deadline, explorer.communicate()[0][-3000:]
            time.sleep(0.02)
        explorer.kill()  # the launcher only: its rollout workers end with it
        explorer.communicate()
        assert _saved_step(state_file) < steps, "the explore launch ended before the kill"
        _wait_for_the_run_lock(os.path.join(run_dir, "explorer", "launch", "owner.lock"))
        _read_until(trainer, "the explore launch of this run is gone", timeout_s=120)
        explorer = _start(path, "explore", "continue_from_checkpoint=true")
    _finish(explorer, "mode explore")
    _finish(trainer, "mode train")
    with open(state_file) as f:
        saved = json.load(f)
    assert saved["explore_step"] == steps
    by_step = {m["step"]: m for m in read_metrics(os.path.join(run_dir, "explorer"))}
    return saved["task_selection"], [by_step[s] for s in sorted(by_step)]


def _saved_step(state_file: str) -> int:
    try:
        with open(state_file) as f:
            return int(json.load(f)["explore_step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def test_a_decoupled_explorer_killed_mid_run_resumes_its_task_history_exactly(tmp_path) -> None:
    """Killed once step 3's put is saved (the epoch's 2 batches explored, the filter skipping the
    solved half since): the resumed explore launch ends with the history (pass rates, reward means,
    last steps, counts) and the walk's position of the run never killed, and drew the same tasks."""
    straight, straight_metrics = _decoupled_run(str(tmp_path / "straight"))
    resumed, resumed_metrics = _decoupled_run(str(tmp_path / "killed"), kill_at=3)
    assert len(straight["history"]) == 8
    assert resumed == straight
    assert [m["step"] for m in resumed_metrics] == [m["step"] for m in straight_metrics]
    for x, y in zip(straight_metrics, resumed_metrics, strict=True):
        for key in ("tasks/skipped_easy", "tasks/pool_easy", "tasks/pool_open", "tasks/seen", "tasks/pass_rate_mean"):
            assert x.get(key) == y.get(key), (x["step"], key, x.get(key), y.get(key))
    assert all(m.get("tasks/skipped_easy", 0) > 0 for m in straight_metrics[2:]), straight_metrics
