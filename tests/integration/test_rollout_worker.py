"""`rlcore rollout serve` as a real process on loopback, driven from this process: Generate,
GenerateStream and RunTasks through the SDK, a generic reflection-based client with no rlcore
stubs, standard health checking, and clean shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rlcore.client import ClientOptions, RolloutClient
from rlcore.core.types import SamplingParams, Task, WorkflowSpec

from .launch_utils import REPO, wait_for_port_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN_ENV = "RLCORE_IT_ROLLOUT_TOKEN"
TOKEN = "it-rollout-secret"
START_TIMEOUT_S = 120.0
DISTINCT = "tests.integration.rewards:distinct_chars"  # a user reward by import path, run by the worker


@dataclass
class Worker:
    proc: subprocess.Popen
    address: str
    model: str
    log_dir: Path

    def output(self) -> str:
        return (self.log_dir / "stdout").read_text() + (self.log_dir / "stderr").read_text()


def _serve_cmd(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", model, "--max-model-len", "256",
            "--threads", "1", "--token-env", TOKEN_ENV, *extra]  # fmt: skip


@pytest.fixture(scope="module")
def worker(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    log_dir = tmp_path_factory.mktemp("rollout_worker")
    port_file = log_dir / "address"
    env = {**os.environ, TOKEN_ENV: TOKEN}
    with open(log_dir / "stdout", "w") as out, open(log_dir / "stderr", "w") as err:
        # cwd: the repository, so the worker can import the test reward 'tests.integration.rewards:...'
        proc = subprocess.Popen(
            _serve_cmd(tiny_model_path, "--port", "0", "--port-file", str(port_file)),
            cwd=REPO, env=env, stdout=out, stderr=err,
        )  # fmt: skip
    address = wait_for_port_file(
        str(port_file), proc, "rollout worker", START_TIMEOUT_S, log_file=str(log_dir / "stderr")
    )
    w = Worker(proc, address, tiny_model_path, log_dir)
    yield w
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def client(worker: Worker) -> Iterator[RolloutClient]:
    with RolloutClient(worker.address, ClientOptions(token=TOKEN, timeout=60)) as c:
        yield c


def test_generate_from_another_process(worker: Worker, client: RolloutClient) -> None:
    info = client.get_info()
    assert (info.model_path, info.engine, info.max_model_len, info.policy_version) == (
        worker.model,
        "hf",
        256,
        0,
    )
    result = client.generate(["1+2=", [5, 9, 11]], SamplingParams(temperature=1.0, n=2, max_tokens=6, seed=3))
    assert result.policy_version == 0 and [len(s) for s in result.completions] == [2, 2]
    assert result.completions[1][0].prompt_token_ids == [5, 9, 11]
    for c in (c for samples in result.completions for c in samples):
        assert 1 <= len(c.token_ids) <= 6 and len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0 for lp in c.logprobs) and c.finish_reason in ("stop", "length")


def test_generate_stream_sends_every_completion(client: RolloutClient) -> None:
    prompts: list[list[int] | str] = ["1+2=", "7*8=", "9-4="]
    sampling = SamplingParams(temperature=1.0, n=3, max_tokens=5, seed=5)
    streamed = list(client.generate_stream(prompts, sampling))
    assert len(streamed) == 9  # 3 prompts x n 3
    assert sorted((s.prompt_index, s.sample_index) for s in streamed) == [
        (p, s) for p in range(3) for s in range(3)
    ]
    # 9 sequences fit one engine batch (max_batch_size 256): the stream samples what Generate does
    whole = client.generate(prompts, sampling)
    for s in streamed:
        assert s.policy_version == 0
        assert s.completion == whole.completions[s.prompt_index][s.sample_index]


def test_run_tasks_scores_experiences(client: RolloutClient) -> None:
    tasks = [Task(f"task-{i}", f"{i}+{i}=", answer=str(2 * i)) for i in range(3)]
    workflow = WorkflowSpec(
        reward_fn=["exact_match", DISTINCT], reward_weights=[1.0, 0.5],
        max_prompt_tokens=32,
    )  # fmt: skip
    answers = list(
        client.run_tasks(tasks, SamplingParams(temperature=1.0, n=4, max_tokens=6, seed=1), workflow)
    )
    assert sorted(i for i, _ in answers) == [0, 1, 2]
    for i, experiences in answers:
        assert len(experiences) == 4
        for e in experiences:
            assert e.group_id == f"task-{i}" and e.policy_version == 0
            assert 1 <= len(e.response_token_ids) <= 6 and len(e.logprobs) == len(e.response_token_ids)
            assert e.reward_components["exact_match"] in (0.0, 1.0)
            # distinct_chars = distinct characters / 10; reward = 1.0 * exact_match + 0.5 * distinct_chars
            distinct = len(set(e.response_text)) / 10
            assert e.reward_components[DISTINCT] == pytest.approx(distinct)
            assert e.reward == pytest.approx(e.reward_components["exact_match"] + 0.5 * distinct)


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call, as any generic gRPC client can."""

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {TOKEN}")]
        return details._replace(metadata=metadata)  # type: ignore[attr-defined]

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


def test_reflection_client_lists_services_and_calls_generate(worker: Worker) -> None:
    # No rlcore descriptors or stubs here: everything comes from the server's reflection service.
    with grpc.insecure_channel(worker.address) as plain:
        channel = grpc.intercept_channel(plain, _Token())
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"rlcore.v1.RolloutService", "grpc.health.v1.Health"} <= services
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName("rlcore.v1.RolloutService")
        method = service.methods_by_name["Generate"]
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        request = request_class()
        request.prompts.add().text = "1+2="
        request.prompts.add().token_ids.ids.extend([5, 9])
        request.sampling.temperature = 0.0
        request.sampling.n = 2
        request.sampling.max_tokens = 4
        generate = channel.unary_unary(
            f"/{service.full_name}/{method.name}",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        response = generate(request, timeout=60)
    assert len(response.results) == 2
    assert all(len(r.completions) == 2 for r in response.results)
    assert list(response.results[1].completions[0].prompt_token_ids) == [5, 9]
    assert all(1 <= len(c.token_ids) <= 4 for r in response.results for c in r.completions)


def test_health_check_answers_serving(worker: Worker) -> None:
    with grpc.insecure_channel(worker.address) as channel:  # no token needed
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlcore.v1.RolloutService"), timeout=30
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_sigterm_stops_the_worker_with_exit_0(worker: Worker) -> None:
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=60) == 0, worker.output()
    assert f"rlcore: rollout worker serving {worker.model} on {worker.address}" in worker.output()


def test_serve_without_token_exits_2_naming_the_variable(tiny_model_path: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = subprocess.run(
        _serve_cmd(tiny_model_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlcore: error: ") and TOKEN_ENV in lines[0], proc.stderr


def test_serve_of_a_missing_model_folder_exits_2_naming_it(tmp_path) -> None:
    """A path that is not there (say, weights pruned before the worker read them) is named as a
    missing folder, not passed to HF as a malformed hub id."""
    missing = str(tmp_path / "version_5")
    env = {**os.environ, TOKEN_ENV: "t"}
    proc = subprocess.run(_serve_cmd(missing), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"rlcore: error: --model {missing}: no such folder; give an HF model folder or a hub id"
    ), proc.stderr
