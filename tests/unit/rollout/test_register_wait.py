"""A rollout worker started before the launch that serves its run (`rlcore rollout serve --register`
on another host) waits for the run's controller, up to --register-timeout, on a real RunService."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from rlcore.client.base import ClientOptions, RpcError
from rlcore.client.run import RunClient
from rlcore.core.rpc.server import ServerOptions
from rlcore.rollout.serve import _register_first
from rlcore.runtime.run_service import start_run_server

TOKEN = "register-wait-token"
pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_started_before_its_run_registers_once_the_controller_answers(capsys) -> None:
    port = _free_port()
    served = []

    def start_later() -> None:
        time.sleep(1.5)
        served.append(start_run_server("p/r", ServerOptions(token=TOKEN, port=port), heartbeat_interval_s=2.5))

    later = threading.Thread(target=start_later)
    later.start()
    try:
        with RunClient(f"127.0.0.1:{port}", ClientOptions(token=TOKEN, timeout=5.0, retry_attempts=1)) as run:
            assert _register_first(run, "127.0.0.1:5000", 0, wait_s=30.0) == ("rollout-0", 2.5)
        out = capsys.readouterr().out
        assert out.count(f"waiting for the run at 127.0.0.1:{port} to answer (--register-timeout 30 s)") == 1
    finally:
        later.join()
        served[0][0].stop(grace=0.1)


def test_a_run_that_never_answers_fails_after_the_wait_and_a_refusal_at_once() -> None:
    with RunClient(f"127.0.0.1:{_free_port()}", ClientOptions(token=TOKEN, timeout=5.0, retry_attempts=1)) as run:
        started = time.monotonic()
        with pytest.raises(RpcError) as e:
            _register_first(run, "127.0.0.1:5000", 0, wait_s=1.0)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE and time.monotonic() - started >= 1.0
    server, _ = start_run_server("p/r", ServerOptions(token=TOKEN), heartbeat_interval_s=2.5)
    try:
        with RunClient(server.address, ClientOptions(token="not-the-token", timeout=5.0)) as run:
            started = time.monotonic()
            with pytest.raises(RpcError) as e:  # a wrong token is not waited out
                _register_first(run, "127.0.0.1:5000", 0, wait_s=30.0)
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED and time.monotonic() - started < 10
    finally:
        server.stop(grace=0.1)
