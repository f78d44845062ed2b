"""The explorer's task scheduler (over-rollout, dynamic timeout, per-task retries) against a real
rollout worker in this process (HFEngine on the scratch model behind gRPC on loopback), with the
slow-tail workflow of `rlcore bench tails`: some tasks wait seconds after generating."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from rlcore.benchmarks.long_tails import is_slow
from rlcore.client import ClientOptions, RolloutClient
from rlcore.core.config.schema import RLCoreConfig
from rlcore.core.rpc.server import RpcServer, ServerOptions
from rlcore.core.types import SamplingParams, Task, WorkflowSpec
from rlcore.rollout.batching import BatchingEngine
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.remote import RemoteRollout, WorkersPaused
from rlcore.rollout.scheduler import MIN_DYNAMIC_TIMEOUT_S, TaskScheduler
from rlcore.rollout.server import build_rollout_server

TOKEN = "test-scheduler-token"
SAMPLING = SamplingParams(temperature=1.0, n=4, max_tokens=6, seed=7)
FRACTION = 0.2  # of t0..t7 only t2 is slow; of t12..t19 none
SLOW_S = 4.0
SLOW_TASK_S = 30.0
"""The slow task of the dynamic-timeout test: far longer than the timeouts that cut it."""

pytestmark = pytest.mark.timeout(120)


def _spec(slow_s: float = SLOW_S) -> WorkflowSpec:
    return WorkflowSpec(
        reward_fn=["exact_match"], max_prompt_tokens=64, name="rlcore.benchmarks.long_tails:SlowTailWorkflow",
        args={"slow_fraction": FRACTION, "slow_s": slow_s},
    )  # fmt: skip


def _tasks(ids: range) -> list[Task]:
    return [Task(f"t{i}", f"{i}+{i}=", answer=str(2 * i)) for i in ids]


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> HFEngine:
    torch.set_num_threads(1)
    return HFEngine(tiny_model_path, max_model_len=256, max_batch_size=64)


@pytest.fixture(scope="module")
def server(engine: HFEngine) -> Iterator[RpcServer]:
    server = build_rollout_server(engine, engine_name="hf", model_path="tiny", options=ServerOptions(token=TOKEN))
    yield server
    server.stop(grace=0)


def _scheduler(server: RpcServer, monkeypatch, **explorer) -> TaskScheduler:
    monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
    cfg = RLCoreConfig()
    cfg.model.max_model_len = 256
    cfg.explorer.max_timeout = explorer.pop("max_timeout", 60.0)
    cfg.explorer.max_retry_times = explorer.pop("max_retry_times", 0)
    cfg.explorer.over_rollout.ratio = explorer.pop("ratio", 0.0)
    cfg.explorer.over_rollout.wait_after_min = explorer.pop("wait_after_min", 0.0)
    if "dynamic_ratio" in explorer:
        cfg.explorer.dynamic_timeout.enable = True
        cfg.explorer.dynamic_timeout.ratio = explorer.pop("dynamic_ratio")
    assert not explorer
    return TaskScheduler(cfg, RemoteRollout(cfg, [server.address]))


def test_the_slow_tail_is_what_the_test_thinks() -> None:
    assert [i for i in range(20) if is_slow(f"t{i}", FRACTION)] == [2, 11]


def test_over_rollout_leaves_the_slow_tail_running_for_the_next_step(server: RpcServer, monkeypatch) -> None:
    scheduler = _scheduler(server, monkeypatch, ratio=0.25, wait_after_min=1.5)  # 6 of 8 done, then 1.5 s more
    tasks = _tasks(range(8))
    try:
        start = time.monotonic()
        scheduler.submit([(t, SAMPLING, _spec()) for t in tasks], version=3)
        first, metrics = scheduler.collect(len(tasks))
        waited = time.monotonic() - start
        assert [t.task_id for t in scheduler.running_tasks()] == ["t2"]  # an explorer's state keeps it
        rest, last = scheduler.collect(0, everything=True)
    finally:
        scheduler.close()
    assert waited < SLOW_S  # the step did not wait for t2, only for the other fast ones
    assert {e.group_id for e in first} == {t.task_id for t in tasks} - {"t2"}
    assert metrics["rollout/tasks_done"] == 7 and metrics["rollout/tasks_left_running"] == 1
    assert {e.group_id for e in rest} == {"t2"} and last["rollout/tasks_left_running"] == 0
    assert scheduler.running_tasks() == []
    assert all(e.policy_version == 3 for e in first + rest)
    # the same samples as the whole batch in one call: each task's seed is its own
    with RolloutClient(server.address, ClientOptions(token=TOKEN, timeout=60)) as client:
        whole = {
            tasks[i].task_id: [e.response_token_ids for e in exps]
            for i, exps in client.run_tasks(tasks, SAMPLING, _spec(0.0))
        }
    by_task: dict[str, list[list[int]]] = {}
    for e in first + rest:
        by_task.setdefault(e.group_id, []).append(e.response_token_ids)
    assert by_task == whole


def test_dynamic_timeout_cuts_the_slow_task_retries_it_then_leaves_it_out(
    server: RpcServer, monkeypatch
) -> None:
    scheduler = _scheduler(server, monkeypatch, dynamic_ratio=4.0, max_retry_times=1)
    try:
        scheduler.submit([(t, SAMPLING, _spec()) for t in _tasks(range(12, 20))], version=0)
        warm, metrics = scheduler.collect(8)  # no task is slow (test_the_slow_tail_is_what_the_test_thinks)
        # the promise: ratio x the running mean of the tasks' seconds (how long they take is the machine's)
        timeout = max(MIN_DYNAMIC_TIMEOUT_S, 4.0 * metrics["rollout/task_s_mean"])
        assert len({e.group_id for e in warm}) == 8
        assert metrics["rollout/task_timeout_s"] == pytest.approx(timeout)
        start = time.monotonic()
        scheduler.submit([(t, SAMPLING, _spec(SLOW_TASK_S)) for t in _tasks(range(8))], version=1)
        exps, metrics = scheduler.collect(8)
        waited = time.monotonic() - start
    finally:
        scheduler.close()
    assert waited < SLOW_TASK_S  # cut twice at the dynamic timeout, never waited out
    assert {e.group_id for e in exps} == {f"t{i}" for i in range(8)} - {"t2"}
    assert metrics["rollout/tasks_dropped"] == 1 and metrics["rollout/tasks_timed_out"] >= 2
    assert metrics["rollout/tasks_retried"] >= 1 and metrics["rollout/tasks_left_running"] == 0


def test_concurrent_generate_calls_are_merged_into_fewer_engine_calls(engine: HFEngine) -> None:
    """Eight tasks' calls at once: fewer engine calls, each task's completions those of a call alone."""
    batching = BatchingEngine(engine, threading.Lock())
    prompts = [engine.tokenizer(f"{i}+{i}=")["input_ids"] for i in range(8)]
    alone = [engine.generate([p], SAMPLING)[0] for p in prompts]
    got: list = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def call(i: int) -> None:
        barrier.wait()
        got[i] = batching.generate([prompts[i]], SAMPLING)[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert batching.calls < len(prompts)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in a] for a in alone]

    # the HTTP door's requests arrive one by one: the first lingers and the rest join its call
    before, versions = batching.calls, [-1] * len(prompts)
    barrier.reset()

    def lingering(i: int) -> None:
        barrier.wait()
        (got[i],), versions[i] = batching.generate_versioned([prompts[i]], SAMPLING, linger_s=0.5)

    threads = [threading.Thread(target=lingering, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert batching.calls == before + 1 and versions == [engine.policy_version] * len(prompts)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in a] for a in alone]


def test_a_weight_load_waits_for_the_engine_call_not_for_a_task_in_its_slow_reward(
    server: RpcServer, tiny_model_path: str
) -> None:
    """A task's reward runs outside the generation gate: a checkpoint load that comes in meanwhile
    is done seconds before the task is, and a new task is refused only while the load runs."""
    got: list = []
    with RolloutClient(server.address, ClientOptions(token=TOKEN, timeout=60)) as client:
        version = client.get_info().policy_version
        task = threading.Thread(
            target=lambda: got.extend(client.run_tasks(_tasks(range(2, 3)), SAMPLING, _spec()))
        )
        start = time.monotonic()
        task.start()
        time.sleep(1.0)  # generated by now; t2 waits SLOW_S in its workflow
        client.begin_weight_update(version + 1, [], 1, checkpoint_path=tiny_model_path)
        client.finish_weight_update(version + 1)
        loaded = time.monotonic() - start
        task.join(60)
        assert client.get_info().policy_version == version + 1
    assert loaded < SLOW_S - 1.0 and time.monotonic() - start >= SLOW_S
    (index, exps), = got
    assert index == 0 and len(exps) == SAMPLING.n and all(e.policy_version == version for e in exps)


def test_a_batch_with_every_worker_gone_names_them(server: RpcServer, monkeypatch) -> None:
    """Once the last worker was dropped, a retried batch says which stopped (it once divided the batch
    by zero workers)."""
    monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
    cfg = RLCoreConfig()
    cfg.model.max_model_len = 256
    rollout = RemoteRollout(cfg, [server.address])
    rollout.clients.clear()
    rollout.lost.append(server.address)
    with pytest.raises(RuntimeError, match=rf"^no rollout worker answers: {server.address} stopped$"):
        rollout.run([Task("t", "1+1=")], SamplingParams(max_tokens=2), WorkflowSpec(["exact_match"]), timeout=10)


def test_a_paused_worker_is_kept_and_named_not_dropped(server: RpcServer, monkeypatch) -> None:
    """A worker that refuses a batch because it is paused (a weight update holds it: one whose sender
    died part way holds it until the next version) but answers GetInfo is alive: the batch raises
    WorkersPaused naming it and the version it serves, and the worker stays, where it was once
    dropped as gone (the explorer then waited minutes for a restart that never came)."""
    monkeypatch.setenv("RLCORE_TOKEN", TOKEN)
    cfg = RLCoreConfig()
    cfg.model.max_model_len = 256
    cfg.control.retry_attempts = 2
    rollout = RemoteRollout(cfg, [server.address])
    client = RolloutClient(server.address, ClientOptions(token=TOKEN))
    version = client.pause()
    spec, tasks = WorkflowSpec(["exact_match"], max_prompt_tokens=64), _tasks(range(2))
    try:
        with pytest.raises(WorkersPaused) as paused:
            rollout.run(tasks, SamplingParams(max_tokens=2, seed=1), spec, timeout=30)
    finally:
        client.resume()
    assert paused.value.addresses == [server.address] and paused.value.version == version
    assert [c.address for c in rollout.clients] == [server.address] and rollout.lost == []
    assert len(rollout.run(tasks, SamplingParams(max_tokens=2, seed=1), spec, timeout=30)) == 2
    rollout.close()
    client.close()
