"""ServiceWatch: a remote trainer's service that stops answering ends the main thread's wait,
wherever it waits (a wait without a timeout, under an `except Exception` that retries), and a stop
request ends it at once while the service is silent."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from rlcore.runtime.service_watch import WAKE, ServiceLost, ServiceWatch

SERVICE = "the Tinker service at http://127.0.0.1:1"


class Service:
    """A probe that answers until `silent` is set."""

    def __init__(self) -> None:
        self.silent = threading.Event()

    def answers(self, timeout_s: float) -> bool:
        return not self.silent.is_set()


def _watch(service: Service, stopping=lambda: False) -> ServiceWatch:
    return ServiceWatch(SERVICE, service.answers, 0.2, stopping)


def test_a_silent_service_ends_a_wait_that_has_no_timeout_even_under_except_exception() -> None:
    service = Service()
    threading.Timer(0.3, service.silent.set).start()
    start = time.monotonic()
    with pytest.raises(
        ServiceLost, match=r"^the Tinker service at http://127.0.0.1:1 stopped answering \("
    ) as e:
        with _watch(service) as watch:
            while True:  # a retry loop that takes every failure for a failed call
                try:
                    threading.Event().wait()
                except Exception:
                    pass
    assert "resume the run with continue_from_checkpoint=true" in str(e.value)
    assert time.monotonic() - start < 3.0 and not watch.answering
    assert signal.getsignal(WAKE) is not watch._raise  # the previous handler is back


def test_a_stop_request_while_the_service_is_silent_stops_at_once(capsys) -> None:
    service, stop = Service(), threading.Event()
    with pytest.raises(KeyboardInterrupt):
        with _watch(service, stop.is_set):
            service.silent.set()
            stop.set()
            threading.Event().wait()
    assert f"rlcore: {SERVICE} does not answer: stopping now" in capsys.readouterr().err


def test_a_service_that_answers_is_left_alone_and_a_silent_one_is_named_at_the_start() -> None:
    service = Service()
    with _watch(service) as watch:
        time.sleep(0.8)  # several probes
    assert watch.answering
    service.silent.set()
    with pytest.raises(ServiceLost, match="does not answer: start it"):
        with _watch(service):
            pass


def test_a_trainer_service_that_refuses_the_connection_is_a_lost_service() -> None:
    """trainer.remote over gRPC: a call UNAVAILABLE after its retries says what to do, as the watch does."""
    import grpc

    from rlcore.client.base import RpcError
    from rlcore.runtime.handles import RemoteTrainer

    class Gone:
        address = "127.0.0.1:1"

        def optim_step(self):
            raise RpcError(
                "OptimStep", grpc.StatusCode.UNAVAILABLE, "Connection refused", "trainer 127.0.0.1:1"
            )

    with pytest.raises(ServiceLost) as e:
        RemoteTrainer(Gone()).optim_step()  # type: ignore[arg-type]
    assert str(e.value) == (
        "the trainer service (rlcore trainer serve) at 127.0.0.1:1 stopped answering (OptimStep: Connection "
        "refused): restart it, then resume the run with continue_from_checkpoint=true"
    )
