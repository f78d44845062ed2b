"""RunService in process on loopback, driven by the real RunClient / AsyncRunClient."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from rlcore.client.base import ClientOptions, RpcError
from rlcore.client.run import AsyncRunClient, MetricsRecord, RunClient
from rlcore.core.rpc.server import RpcServer, ServerOptions
from rlcore.proto.v1 import run_pb2
from rlcore.runtime.run_service import RunServicer, start_run_server

TOKEN = "run-service-test-token"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def served() -> Iterator[tuple[RpcServer, RunServicer]]:
    server, servicer = start_run_server("proj/run1", ServerOptions(token=TOKEN), heartbeat_interval_s=2.5)
    yield server, servicer
    server.stop(grace=0.5)


@pytest.fixture()
def client(served: tuple[RpcServer, RunServicer]) -> Iterator[RunClient]:
    with RunClient(served[0].address, ClientOptions(token=TOKEN, timeout=10.0)) as c:
        yield c


def rec(step: int, loss: float, stage: str = "grpo") -> MetricsRecord:
    return MetricsRecord(stage=stage, step=step, metrics={"actor/pg_loss": loss}, time=1000.0 + step)


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_workers_register_heartbeat_and_appear_in_status(
    served: tuple[RpcServer, RunServicer], client: RunClient
) -> None:
    _, servicer = served
    assert client.get_status().state == "STARTING"
    # Registered out of index order: ids follow the index, addresses come back in index order.
    assert client.register_worker("rollout", "127.0.0.1:5001", index=1) == ("rollout-1", 2.5)
    assert client.register_worker("rollout", "127.0.0.1:5000", index=0) == ("rollout-0", 2.5)
    assert client.register_worker("trainer", index=0) == ("trainer-0", 2.5)
    # A self-joined worker (index -1) gets the next free number of its role: 2 rollout workers -> 2.
    assert client.register_worker("rollout", "localhost:5002")[0] == "rollout-2"

    assert client.heartbeat(
        "trainer-0", "grpo", step=3, total_steps=10, policy_version=3, records=[rec(3, 0.5)]
    ) == (
        "RUNNING"  # the trainer registering started the run
    )
    assert client.heartbeat("rollout-1", policy_version=2) == "RUNNING"

    status = client.get_status()
    assert (status.run, status.state, status.stage, status.step, status.total_steps) == (
        "proj/run1", "RUNNING", "grpo", 3, 10,
    )  # fmt: skip
    assert status.error == "" and status.uptime_s > 0
    assert [(w.worker_id, w.role, w.address, w.policy_version) for w in status.workers] == [
        ("trainer-0", "trainer", "", 3),
        ("rollout-0", "rollout", "127.0.0.1:5000", 0),
        ("rollout-1", "rollout", "127.0.0.1:5001", 2),
        ("rollout-2", "rollout", "localhost:5002", 0),
    ]
    assert all(0 <= w.last_seen_s < 5 for w in status.workers)
    # A rollout worker's heartbeat never moves the trainer's progress.
    client.heartbeat("rollout-0", stage="other", step=99)
    assert client.get_status().step == 3
    assert servicer.rollout_addresses() == ["127.0.0.1:5000", "127.0.0.1:5001", "localhost:5002"]

    # The launcher's worker 1 restarted on another port: same id, the new address replaces the old.
    assert client.register_worker("rollout", "127.0.0.1:5011", index=1)[0] == "rollout-1"
    assert servicer.rollout_addresses() == ["127.0.0.1:5000", "127.0.0.1:5011", "localhost:5002"]
    # Index 2 would take the self-joined worker's id.
    with pytest.raises(RpcError) as e:
        client.register_worker("rollout", "127.0.0.1:5012", index=2)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "rollout-2 is taken by a worker that joined on its own" in e.value.details


def test_stream_metrics_sends_history_then_live_records_and_ends_when_the_run_finishes(
    served: tuple[RpcServer, RunServicer], client: RunClient
) -> None:
    _, servicer = served
    worker_id, _ = client.register_worker("trainer")
    history = [rec(1, 0.9, stage="before"), rec(2, 0.8, stage="before")]
    client.heartbeat(worker_id, "grpo", 2, 10, records=history)

    with_history: list[MetricsRecord] = []
    live_only: list[MetricsRecord] = []

    def watch(out: list[MetricsRecord], include_history: bool) -> None:
        with RunClient(served[0].address, ClientOptions(token=TOKEN, timeout=30.0)) as c:
            out.extend(c.stream_metrics(include_history=include_history))

    threads = [
        threading.Thread(target=watch, args=(with_history, True)),
        threading.Thread(target=watch, args=(live_only, False)),
    ]
    for t in threads:
        t.start()
    wait_until(lambda: len(with_history) >= 2)
    # The live-only stream subscribes at some unknown moment: send live records until it has one.
    step = 3
    while not live_only:
        client.heartbeat(worker_id, "grpo", step, 10, records=[rec(step, 1.0 / step)])
        step += 1
        time.sleep(0.05)
    live = [rec(s, 1.0 / s) for s in range(3, step)]
    wait_until(lambda: len(with_history) == 2 + len(live))
    assert all(t.is_alive() for t in threads)  # streams stay open while the run runs

    servicer.mark_finished()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)
    assert with_history == history + live
    # Whatever it subscribed to, it saw a suffix of the live records and none of the history.
    assert live_only == live[len(live) - len(live_only) :] and live_only[-1].step == step - 1
    assert client.get_status().state == "FINISHED"


def test_pause_resume_stop_and_what_heartbeats_answer(
    served: tuple[RpcServer, RunServicer], client: RunClient
) -> None:
    _, servicer = served
    with pytest.raises(RpcError) as e:
        client.pause()  # still STARTING
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot pause a run that is STARTING" in e.value.details

    servicer.mark_running()
    worker_id, _ = client.register_worker("trainer")
    assert client.pause() == "PAUSED"
    assert client.heartbeat(worker_id) == "PAUSED"
    assert servicer.requested_state() == "PAUSED"
    with pytest.raises(RpcError) as e:
        client.pause()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION

    assert client.resume() == "RUNNING"
    assert client.heartbeat(worker_id) == "RUNNING"
    with pytest.raises(RpcError) as e:
        client.resume()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot resume a run that is RUNNING" in e.value.details

    assert client.pause() == "PAUSED"
    assert client.stop() == "STOPPING"  # stopping a paused run is allowed
    assert client.heartbeat(worker_id) == "STOPPING"
    assert servicer.requested_state() == "STOPPING"
    with pytest.raises(RpcError) as e:
        client.resume()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION

    servicer.mark_finished()
    with pytest.raises(RpcError) as e:
        client.stop()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot stop a run that is FINISHED" in e.value.details


def test_a_stop_asked_while_starting_survives_the_trainer_registering(
    served: tuple[RpcServer, RunServicer], client: RunClient
) -> None:
    _, servicer = served
    assert client.stop() == "STOPPING"
    client.register_worker("trainer")
    servicer.mark_running()
    assert client.get_status().state == "STOPPING"


def test_a_failed_run_reports_its_reason(served: tuple[RpcServer, RunServicer], client: RunClient) -> None:
    _, servicer = served
    servicer.mark_running()
    servicer.mark_failed("trainer rank 0 exited with code 1")
    status = client.get_status()
    assert (status.state, status.error) == ("FAILED", "trainer rank 0 exited with code 1")
    with pytest.raises(RpcError) as e:
        client.pause()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_malformed_requests_answer_invalid_argument_naming_the_field(client: RunClient) -> None:
    def invalid(call) -> str:
        with pytest.raises(RpcError) as e:
            call()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        return e.value.details

    assert invalid(lambda: client.heartbeat("rollout-7")).startswith(
        "worker_id: 'rollout-7' is not registered"
    )
    details = invalid(lambda: client._unary("RegisterWorker", run_pb2.RegisterWorkerRequest(address="h:1")))
    assert details.startswith("role:")
    for bad in ["", "localhost", "localhost:0", "localhost:70000", ":5000", "host:abc", "::1:5000"]:
        assert invalid(lambda bad=bad: client.register_worker("rollout", bad)).startswith("address:"), bad
    # A trainer may serve nothing, but an address it gives must be valid.
    assert invalid(lambda: client.register_worker("trainer", "nohost")).startswith("address:")
    assert invalid(lambda: client.register_worker("rollout", "h:1", index=-2)).startswith("index:")
    assert client.register_worker("rollout", "[::1]:5000")[0] == "rollout-0"  # still serving
    with pytest.raises(ValueError, match="role must be one of rollout, trainer"):
        client.register_worker("critic", "h:1")


def test_calls_without_the_token_are_unauthenticated(served: tuple[RpcServer, RunServicer]) -> None:
    for token in [None, "wrong"]:
        with RunClient(served[0].address, ClientOptions(token=token, timeout=5.0)) as c:
            with pytest.raises(RpcError) as e:
                c.get_status()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(RpcError) as e:
                list(c.stream_metrics(include_history=True))
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_wait_for_workers_returns_addresses_in_index_order(
    served: tuple[RpcServer, RunServicer], client: RunClient
) -> None:
    _, servicer = served
    client.register_worker("rollout", "127.0.0.1:6002", index=2)

    def late_joiners() -> None:
        time.sleep(0.3)  # after wait_for_workers started waiting: it must wake on registration
        client.register_worker("rollout", "127.0.0.1:6000", index=0)
        client.register_worker("rollout", "127.0.0.1:6001", index=1)

    t = threading.Thread(target=late_joiners)
    t.start()
    addresses = servicer.wait_for_workers("rollout", 3, timeout_s=20, alive=lambda: None)
    t.join()
    assert addresses == ["127.0.0.1:6000", "127.0.0.1:6001", "127.0.0.1:6002"]


def test_wait_for_workers_times_out_naming_the_config_key(served: tuple[RpcServer, RunServicer]) -> None:
    _, servicer = served
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0 of 2 rollout workers .* control\.worker_start_timeout"):
        servicer.wait_for_workers("rollout", 2, timeout_s=0.3, alive=lambda: None)
    assert 0.3 <= time.monotonic() - start < 5


def test_wait_for_workers_raises_at_once_when_a_worker_died(served: tuple[RpcServer, RunServicer]) -> None:
    _, servicer = served
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rollout worker 1 exited with code 1"):
        servicer.wait_for_workers(
            "rollout", 2, timeout_s=30, alive=lambda: "rollout worker 1 exited with code 1"
        )
    assert time.monotonic() - start < 5  # not the 30 s timeout


def test_async_client_reads_status_and_streams_metrics(served: tuple[RpcServer, RunServicer]) -> None:
    server, servicer = served

    async def main() -> tuple[str, list[MetricsRecord]]:
        async with AsyncRunClient(server.address, ClientOptions(token=TOKEN, timeout=10.0)) as c:
            worker_id, interval = await c.register_worker("trainer", index=0)
            assert (worker_id, interval) == ("trainer-0", 2.5)
            assert await c.heartbeat(worker_id, "sft", 1, 4, records=[rec(1, 2.0, "sft")]) == "RUNNING"
            status = await c.get_status()
            received = []
            async for r in c.stream_metrics(include_history=True):
                received.append(r)
                if len(received) == 1:  # history seen: send a live record, then end the run
                    await c.heartbeat(worker_id, "sft", 2, 4, records=[rec(2, 1.5, "sft")])
                if len(received) == 2:
                    servicer.mark_finished()
            return status.state, received

    state, received = asyncio.run(main())
    assert state == "RUNNING"
    assert received == [rec(1, 2.0, "sft"), rec(2, 1.5, "sft")]
