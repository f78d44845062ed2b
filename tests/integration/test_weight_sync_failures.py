"""Weight sync against a real `rlcore rollout serve` process when things go wrong: a bucket damaged
on the wire (refused, the worker keeps serving the last good version) and a stalled worker (an
error naming the worker and the phase within synchronizer.sync_timeout, never a hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from rlcore.client import ClientOptions, RolloutClient
from rlcore.core.types import SamplingParams
from rlcore.weights.sender import WeightSender
from rlcore.weights.wire import WeightSyncError, spec_of

from .launch_utils import REPO, wait_for_port_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN_ENV = "RLCORE_IT_SYNC_TOKEN"
TOKEN = "it-sync-secret"
TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def worker(
    tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen, str]]:
    log_dir = tmp_path_factory.mktemp("sync_worker")
    port_file, log_file = str(log_dir / "address"), str(log_dir / "log")
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", tiny_model_path, "--max-model-len",
             "256", "--threads", "1", "--token-env", TOKEN_ENV, "--port", "0", "--port-file", port_file],
            cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    address = wait_for_port_file(port_file, proc, "rollout worker", 120, log_file)
    yield proc, address
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait()


def _model_weights(model_path: str, scale: float) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    return [(n, p.detach() * scale) for n, p in model.named_parameters()]


def _sender(address: str) -> tuple[WeightSender, RolloutClient]:
    client = RolloutClient(address, ClientOptions(token=TOKEN, timeout=30))
    sender = WeightSender([client], backend="gloo", timeout_s=TIMEOUT_S, bucket_bytes=1 << 18, checksums=True)
    return sender, client


def _until_silent(client: RolloutClient, within_s: float = 30.0) -> None:
    """Until the worker stopped answering: a stopped `rlcore` on a fork server is mirrored onto its
    fork within the server's STOP_POLL_S, and a whole sync may fit in that."""
    from rlcore.client import RpcError

    deadline = time.monotonic() + within_s
    while True:
        try:
            client.get_info(timeout=0.5)
        except RpcError:
            return
        assert time.monotonic() < deadline, f"the stopped worker still answers after {within_s:g} s"
        time.sleep(0.05)


def test_a_damaged_bucket_is_refused_and_the_worker_keeps_its_last_good_version(
    worker, tiny_model_path
) -> None:
    _, address = worker
    sender, client = _sender(address)
    weights = _model_weights(tiny_model_path, 1.1)
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    stats = sender.send(specs, iter(weights), 1)
    assert stats["num_bytes"] > sum(s.nbytes for s in specs)  # payload + one checksum trailer per bucket
    good = client.generate(["12+30="], greedy)
    assert good.policy_version == 1

    group = sender.group
    assert group is not None
    real, sent = group.broadcast_async, [0]

    def damage_bucket_2(buf: torch.Tensor):
        if sent[0] == 2:
            buf[-20] ^= 0x04  # a flipped bit in the payload, after the checksum was sealed
        sent[0] += 1
        return real(buf)

    group.broadcast_async = damage_bucket_2  # type: ignore[method-assign]
    with pytest.raises(WeightSyncError, match=rf"{address} .* in phase load: .*DATA_LOSS.*bucket 2 \("):
        sender.send(specs, iter(_model_weights(tiny_model_path, 3.0)), 2)
    group.broadcast_async = real  # type: ignore[method-assign]
    after = client.generate(["12+30="], greedy)  # not paused, and still version 1's weights
    assert after.policy_version == 1 and after.completions == good.completions
    assert sender.send(specs, iter(_model_weights(tiny_model_path, 1.2)), 3)["num_bytes"] > 0
    assert client.get_info().policy_version == 3
    sender.close()
    client.close()


def test_a_stalled_worker_becomes_an_error_naming_it_and_the_phase_within_the_timeout(
    worker, tiny_model_path
) -> None:
    proc, address = worker
    sender, client = _sender(address)
    weights = _model_weights(tiny_model_path, 1.0)
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    version = client.get_info().policy_version + 1
    sender.send(specs, iter(weights), version)  # the group forms and works
    os.kill(proc.pid, signal.SIGSTOP)  # the worker stops answering anything
    _until_silent(client)
    start = time.perf_counter()
    with pytest.raises(WeightSyncError) as error:
        sender.send(specs, iter(weights), version + 1)
    elapsed = time.perf_counter() - start
    message = str(error.value)
    assert (
        f"rollout worker {address} did not answer within {TIMEOUT_S:g} s (synchronizer.sync_timeout)"
        in message
    )
    assert "in phase begin" in message
    assert elapsed < 3 * TIMEOUT_S, elapsed  # the phase's timeout, with room for a loaded machine; not a hang
    os.kill(proc.pid, signal.SIGCONT)
    sender.close()
    client.close()


def test_a_sender_that_gave_up_mid_transfer_and_starts_over_is_waited_for_not_refused(
    worker, tiny_model_path
) -> None:
    """The sender's broadcast fails before its first bucket left (as when its machine stalled past
    the timeout) and it forms a new group at once: the worker is still waiting for that bucket (until
    its group's timeout), and joins the new group once that receive ended, instead of refusing with
    FAILED_PRECONDITION (which ended a loaded multi-host run)."""
    _, address = worker
    sender, client = _sender(address)
    weights = _model_weights(tiny_model_path, 1.0)
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]
    version = client.get_info().policy_version + 1
    sender.send(specs, iter(weights), version)
    group = sender.group  # kept: its connections stay open, so the worker waits out its timeout
    assert group is not None

    def give_up(buf: torch.Tensor):
        raise RuntimeError("the sender gave up before sending")

    group.broadcast_async = give_up  # type: ignore[method-assign]
    with pytest.raises(WeightSyncError, match="in phase send"):
        sender.send(specs, iter(weights), version + 1)
    again = WeightSender(
        [RolloutClient(address, ClientOptions(token=TOKEN, timeout=30))], backend="gloo", timeout_s=3 * TIMEOUT_S,
        bucket_bytes=1 << 18, checksums=True,
    )  # fmt: skip
    again.send(specs, iter(_model_weights(tiny_model_path, 1.1)), version + 1)
    assert client.get_info().policy_version == version + 1
    again.close()
    sender.close()
    client.close()
    del group
