"""RolloutService in this process (a real HFEngine on the scratch model behind a real gRPC server on
loopback): request validation, auth, limits, pause, parity with the engine, streaming, retries."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlcore.client import AsyncRolloutClient, ClientOptions, RolloutClient, RpcError
from rlcore.core.config.schema import JudgeConfig
from rlcore.core.rpc.security import bearer
from rlcore.core.rpc.server import MiB, RpcServer, ServerOptions
from rlcore.core.types import SamplingParams, Task, WorkflowSpec
from rlcore.proto.v1 import common_pb2, rollout_pb2
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.rewards.compose import build_reward
from rlcore.rollout.rewards.judge import judge_settings
from rlcore.rollout.server import build_rollout_server
from rlcore.rollout.workflows.single_turn import SingleTurnWorkflow

TOKEN = "test-rollout-token"
MAX_MESSAGE = 1 * MiB
MAX_MODEL_LEN = 256
VOCAB = 87  # the scratch model's character vocabulary
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
EXACT = WorkflowSpec(reward_fn=["exact_match"], max_prompt_tokens=64)
TASK = Task("t0", "1+1=", answer="2")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> HFEngine:
    torch.set_num_threads(1)
    # max_batch_size 4 makes a streamed request of a few prompts run in several engine calls.
    return HFEngine(tiny_model_path, max_model_len=MAX_MODEL_LEN, max_batch_size=4)


def _serve(engine: HFEngine, port: int = 0) -> RpcServer:
    options = ServerOptions(token=TOKEN, port=port, max_message_bytes=MAX_MESSAGE)
    return build_rollout_server(engine, engine_name="hf", model_path="tiny", options=options)


@pytest.fixture(scope="module")
def server(engine: HFEngine) -> Iterator[RpcServer]:
    server = _serve(engine)
    yield server
    server.stop(grace=0)


@pytest.fixture(scope="module")
def client(server: RpcServer) -> Iterator[RolloutClient]:
    with RolloutClient(server.address, ClientOptions(token=TOKEN, timeout=60)) as c:
        yield c


def _code(call: Callable[[], Any]) -> RpcError:
    with pytest.raises(RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    return info.value


def _raw(client: RolloutClient, method: str, request: Any) -> Callable[[], Any]:
    """Send a hand-built request (one the typed client cannot produce) through the client's stub."""

    def call() -> Any:
        try:
            answer = getattr(client.stub, method)(request, timeout=30, metadata=bearer(TOKEN))
            return list(answer) if not hasattr(answer, "ListFields") else answer
        except grpc.RpcError as e:
            raise RpcError(method, e.code(), e.details()) from None

    return call


def _tasks(c: RolloutClient, tasks: list[Task], workflow: WorkflowSpec = EXACT, **sampling: Any) -> Any:
    return lambda: c.run_tasks(tasks, SamplingParams(**{"max_tokens": 4, **sampling}), workflow)


def _gen(c: RolloutClient, prompts: list, **sampling: Any) -> Any:
    return lambda: c.generate(prompts, SamplingParams(**{"max_tokens": 4, **sampling}))


def _sync(**fields: Any) -> rollout_pb2.InitWeightSyncRequest:
    good = dict(master_address="127.0.0.1", master_port=29500, world_size=2, rank=1, backend="gloo",
                timeout_s=5.0, group_name="g")  # fmt: skip
    return rollout_pb2.InitWeightSyncRequest(**{**good, **fields})


JUDGE = judge_settings(JudgeConfig(model="j"))

# (case id, call on the client, field the message must start with)
MALFORMED: list[tuple[str, Callable[[RolloutClient], Any], str]] = [
    ("no-prompts", lambda c: _gen(c, []), "prompts"),
    ("n-0", lambda c: _gen(c, ["a"], n=0), "sampling.n"),
    ("n-negative", lambda c: _gen(c, ["a"], n=-2), "sampling.n"),
    ("max-tokens-0", lambda c: _gen(c, ["a"], max_tokens=0), "sampling.max_tokens"),
    ("max-tokens-model-len", lambda c: _gen(c, ["a"], max_tokens=MAX_MODEL_LEN), "sampling.max_tokens"),
    ("temperature", lambda c: _gen(c, ["a"], temperature=-0.5), "sampling.temperature"),
    ("top-p", lambda c: _gen(c, ["a"], top_p=1.5), "sampling.top_p"),
    ("top-k", lambda c: _gen(c, ["a"], top_k=-3), "sampling.top_k"),
    ("min-p", lambda c: _gen(c, ["a"], min_p=2.0), "sampling.min_p"),
    ("empty-stop", lambda c: _gen(c, ["a"], stop=[""]), "sampling.stop"),
    ("empty-text", lambda c: _gen(c, ["a", ""]), "prompts[1].text"),
    ("empty-ids", lambda c: _gen(c, [[5], []]), "prompts[1].token_ids"),
    ("id-too-big", lambda c: _gen(c, [[5, 6, VOCAB]]), "prompts[0].token_ids.ids[2]"),
    ("id-negative", lambda c: _gen(c, [[-1]]), "prompts[0].token_ids.ids[0]"),
    # 250 prompt tokens + 10 = 260 > 256
    ("too-long", lambda c: _gen(c, ["a", [5] * 250], max_tokens=10), "prompts[1]"),
    ("no-input", lambda c: _raw(c, "Generate", rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt()], sampling=common_pb2.SamplingParams(n=1, max_tokens=4))), "prompts[0]"),
    ("no-sampling", lambda c: _raw(c, "Generate", rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(text="a")])), "sampling.n"),
    ("stream-no-prompts", lambda c: lambda: c.generate_stream([], SamplingParams()), "prompts"),
    ("stream-too-long", lambda c: lambda: c.generate_stream(["x" * 255], SamplingParams(max_tokens=2)),
     "prompts[0]"),
    ("no-tasks", lambda c: _tasks(c, []), "tasks"),
    ("task-id", lambda c: _tasks(c, [TASK, Task("", "q")]), "tasks[1].task_id"),
    ("task-prompt", lambda c: _tasks(c, [Task("a", "")]), "tasks[0].prompt"),
    ("task-metadata", lambda c: _raw(c, "RunTasks", rollout_pb2.RunTasksRequest(
        tasks=[common_pb2.Task(task_id="a", prompt="q", metadata_json="{nope")],
        sampling=common_pb2.SamplingParams(n=1, max_tokens=4),
        workflow=rollout_pb2.WorkflowSpec(name="single_turn", reward_fn=["exact_match"], max_prompt_tokens=8),
    )), "tasks[0].metadata_json"),
    # 300 characters truncated to max_prompt_tokens 250, + 10 = 260 > 256
    ("task-too-long", lambda c: _tasks(c, [Task("a", "x" * 300)], WorkflowSpec(
        reward_fn=["exact_match"], max_prompt_tokens=250), max_tokens=10), "tasks[0]"),
    # exact_match needs task.answer: the reward refuses the task once it is scored
    ("task-no-answer", lambda c: _tasks(c, [Task("a", "q")]), "workflow.reward_fn"),
    ("task-n-0", lambda c: _tasks(c, [TASK], n=0), "sampling.n"),
    ("workflow-name", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["exact_match"], name="multi")),
     "workflow.name"),
    ("workflow-module", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["exact_match"], name="no_such.mod:Flow")),
     "workflow.name"),
    ("workflow-not-a-workflow", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["exact_match"],
                                                                        name="rlcore.core.types:Task")), "workflow.name"),
    ("workflow-args-json", lambda c: _raw(c, "RunTasks", rollout_pb2.RunTasksRequest(
        tasks=[common_pb2.Task(task_id="a", prompt="q", answer="1")],
        sampling=common_pb2.SamplingParams(n=1, max_tokens=4),
        workflow=rollout_pb2.WorkflowSpec(name="single_turn", reward_fn=["exact_match"], max_prompt_tokens=8,
                                          args_json="[1, 2]"),
    )), "workflow.args_json"),
    # the workflow itself refuses a setting
    ("workflow-args", lambda c: _tasks(c, [TASK], WorkflowSpec(
        reward_fn=["exact_match"], name="tests.integration.workflows:BonusWorkflow", args={"bonus": "high"})),
     "workflow.args_json"),
    ("no-reward", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=[])), "workflow.reward_fn"),
    ("unknown-reward", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["exact_match", "bleu"])),
     "workflow.reward_fn[1]"),
    ("reward-module", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["no_such_pkg.mod:fn"])),
     "workflow.reward_fn[0]"),
    ("reward-attr", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["rlcore.rollout.rewards.answer:nope"])),
     "workflow.reward_fn[0]"),
    ("reward-twice", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["format", "format"])),
     "workflow.reward_fn[1]"),
    ("reward-weights", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["format"], reward_weights=[1, 2])),
     "workflow.reward_weights"),
    ("reasoning-tags", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["format"], reasoning_tags=["<think>"])),
     "workflow.reasoning_tags"),
    ("judge-no-settings", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["exact_match", "judge"])),
     "workflow.judge_json"),
    ("judge-not-listed", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["exact_match"], judge=JUDGE)),
     "workflow.judge_json"),
    ("judge-unknown-model", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["judge"], judge=JUDGE)),
     "workflow.judge_json"),  # no auxiliary model 'j' sent with it
    ("max-prompt-tokens", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["format"], max_prompt_tokens=0)),
     "workflow.max_prompt_tokens"),
    # the scratch tokenizer has no chat template
    ("chat-template", lambda c: _tasks(c, [TASK], WorkflowSpec(reward_fn=["format"], apply_chat_template=True)),
     "workflow.apply_chat_template"),
    ("sync-world", lambda c: _raw(c, "InitWeightSync", _sync(world_size=1)), "world_size"),
    ("sync-rank-0", lambda c: _raw(c, "InitWeightSync", _sync(rank=0)), "rank"),
    ("sync-rank-big", lambda c: _raw(c, "InitWeightSync", _sync(rank=2)), "rank"),
    ("sync-port", lambda c: _raw(c, "InitWeightSync", _sync(master_port=70000)), "master_port"),
    ("sync-address", lambda c: _raw(c, "InitWeightSync", _sync(master_address="")), "master_address"),
    ("sync-backend", lambda c: _raw(c, "InitWeightSync", _sync(backend="mpi")), "backend"),
    ("sync-timeout", lambda c: _raw(c, "InitWeightSync", _sync(timeout_s=0.0)), "timeout_s"),
]  # fmt: skip


@pytest.mark.parametrize(
    "make_call, field", [(m, f) for _, m, f in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_malformed_field_is_invalid_argument_naming_it(
    client: RolloutClient, make_call: Callable[[RolloutClient], Any], field: str
) -> None:
    err = _code(make_call(client))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert err.details.startswith(f"{field}: "), err.details


def test_too_long_prompt_message_gives_the_numbers(client: RolloutClient) -> None:
    err = _code(_gen(client, [[5] * 250], max_tokens=10))
    # 250 + 10 = 260 tokens against max_model_len 256
    assert "250 prompt tokens" in err.details and "= 260" in err.details and "256" in err.details


def test_weight_update_calls_out_of_order_are_failed_precondition(client: RolloutClient) -> None:
    from rlcore.weights.wire import TensorSpec

    err = _code(lambda: client.begin_weight_update(1, [TensorSpec("w", "float32", (2,))], 1024))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "InitWeightSync" in err.details
    err = _code(lambda: client.finish_weight_update(1))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "BeginWeightUpdate" in err.details


def test_missing_or_wrong_token_is_unauthenticated(server: RpcServer) -> None:
    for token in (None, "wrong-token"):
        with RolloutClient(server.address, ClientOptions(token=token, timeout=10)) as c:
            for call in (c.get_info, _gen(c, ["a"]), lambda: c.generate_stream(["a"], GREEDY)):  # noqa: B023
                err = _code(call)
                assert err.code == grpc.StatusCode.UNAUTHENTICATED, err
                assert ("missing" if token is None else "wrong") in err.details


def test_health_answers_serving_without_token(server: RpcServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "rlcore.v1.RolloutService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_oversize_request_is_resource_exhausted(client: RolloutClient) -> None:
    err = _code(_gen(client, ["x" * (MAX_MESSAGE + 100)]))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED, err


def test_server_keeps_serving_after_1000_bad_requests(client: RolloutClient, engine: HFEngine) -> None:
    oversize = "x" * (MAX_MESSAGE + 100)
    makers = [m for _, m, _ in MALFORMED]
    codes: dict[grpc.StatusCode, int] = {}
    for i in range(1000):
        # oversize requests cost ~0.1-0.2 s each here (the server reads the frames it drops)
        call = _gen(client, [oversize]) if i % 50 == 0 else makers[i % len(makers)](client)
        err = _code(call)
        codes[err.code] = codes.get(err.code, 0) + 1
    # every 50th of 1000 is oversize: 20 RESOURCE_EXHAUSTED, the other 980 INVALID_ARGUMENT
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED: 20, grpc.StatusCode.INVALID_ARGUMENT: 980}
    prompt = engine.tokenizer("1+2=", add_special_tokens=False)["input_ids"]
    result = client.generate([prompt], GREEDY)
    assert result.completions[0][0].token_ids == engine.generate([prompt], GREEDY)[0][0].token_ids


def test_pause_refuses_generation_until_resume(server: RpcServer, client: RolloutClient) -> None:
    once = RolloutClient(server.address, ClientOptions(token=TOKEN, retry_attempts=1, timeout=10))
    try:
        assert client.pause() == 0
        assert client.get_info().paused
        err = _code(_gen(once, ["a"]))
        assert err.code == grpc.StatusCode.UNAVAILABLE and err.details.startswith("worker paused")
        err = _code(lambda: once.run_tasks([TASK], SamplingParams(max_tokens=2), EXACT))
        assert err.code == grpc.StatusCode.UNAVAILABLE
    finally:
        assert client.resume() == 0
        once.close()
    assert not client.get_info().paused
    assert len(client.generate(["a"], GREEDY).completions) == 1


def test_greedy_generate_equals_engine_in_process(client: RolloutClient, engine: HFEngine) -> None:
    texts = ["1+2=", "What is 12*3?"]
    ids = [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] + [[5, 9, 11]]
    sampling = SamplingParams(temperature=0.0, n=2, max_tokens=12)
    remote = client.generate([*texts, [5, 9, 11]], sampling)  # text prompts are tokenised by the worker
    local = engine.generate(ids, sampling)
    assert remote.policy_version == 0
    assert len(remote.completions) == 3
    for r_samples, l_samples, prompt in zip(remote.completions, local, ids, strict=True):
        assert len(r_samples) == 2
        for r, lc in zip(r_samples, l_samples, strict=True):
            assert r.prompt_token_ids == prompt
            assert r.token_ids == lc.token_ids and r.finish_reason == lc.finish_reason and r.text == lc.text
            assert len(r.logprobs) == len(lc.logprobs)
            assert max(abs(a - b) for a, b in zip(r.logprobs, lc.logprobs, strict=True)) <= 1e-6


def test_stream_sends_every_completion_chunk_by_chunk(client: RolloutClient, engine: HFEngine) -> None:
    prompts: list[list[int] | str] = ["1+2=", "7*8=", "9-4="]
    sampling = SamplingParams(temperature=1.0, n=3, max_tokens=5, seed=11)
    streamed = list(client.generate_stream(prompts, sampling))
    # max_batch_size 4 // n 3 = 1 prompt per engine call: 3 calls of 3 completions, in order
    assert [(s.prompt_index, s.sample_index) for s in streamed] == [
        (p, s) for p in range(3) for s in range(3)
    ]
    assert all(
        s.policy_version == 0 and len(s.completion.logprobs) == len(s.completion.token_ids) for s in streamed
    )
    # A seeded prompt samples what Generate samples for it alone, whatever chunk it falls in.
    for p in range(3):
        alone = client.generate(prompts[p : p + 1], sampling).completions[0]
        assert [s.completion.token_ids for s in streamed[3 * p : 3 * p + 3]] == [c.token_ids for c in alone]
    # greedy: the stream equals Generate completion for completion
    greedy = client.generate(prompts, GREEDY).completions
    assert [s.completion for s in client.generate_stream(prompts, GREEDY)] == [c for cs in greedy for c in cs]


def test_run_tasks_equals_workflow_in_process(client: RolloutClient, engine: HFEngine) -> None:
    tasks = [Task(f"t{i}", f"{i}+{i}=", answer=str(2 * i)) for i in range(5)]
    spec = WorkflowSpec(reward_fn=["exact_match", "format"], reward_weights=[1.0, 0.5], max_prompt_tokens=64)
    sampling = SamplingParams(temperature=0.0, n=2, max_tokens=6)
    answers = list(client.run_tasks(tasks, sampling, spec))
    # greedy: 4 prompts per engine call, so tasks 0-3 then task 4, each with its 2 experiences
    assert [i for i, _ in answers] == [0, 1, 2, 3, 4]
    workflow = SingleTurnWorkflow(engine, engine.tokenizer, build_reward(["exact_match", "format"], [1.0, 0.5]),
                                  max_prompt_tokens=64)  # fmt: skip
    local = workflow.run(tasks, sampling, policy_version=0)
    remote = [e for _, experiences in answers for e in experiences]
    assert len(remote) == 10
    for r, lc in zip(remote, local, strict=True):
        assert r.group_id == lc.group_id and r.response_token_ids == lc.response_token_ids
        assert r.prompt_token_ids == lc.prompt_token_ids and r.response_text == lc.response_text
        assert r.reward == lc.reward and r.reward_components == lc.reward_components
        assert max(abs(a - b) for a, b in zip(r.logprobs, lc.logprobs, strict=True)) <= 1e-6
        assert set(r.reward_components) == {"exact_match", "format"}


def test_get_info_reports_the_worker(client: RolloutClient) -> None:
    before = client.get_info()
    client.generate(["ab", "cd"], SamplingParams(temperature=0.0, n=3, max_tokens=4))
    info = client.get_info()
    assert (info.engine, info.model_path, info.max_model_len, info.max_batch_size) == ("hf", "tiny", 256, 4)
    assert (info.vocab_size, info.max_message_bytes, info.worker_id) == (VOCAB, MAX_MESSAGE, "")
    assert info.completed_requests == before.completed_requests + 1
    assert 6 <= info.generated_tokens - before.generated_tokens <= 24  # 2 prompts x 3 samples x 1..4 tokens
    assert info.active_requests == 0 and not info.paused


def test_async_client_mirrors_the_blocking_one(server: RpcServer, client: RolloutClient) -> None:
    async def run() -> tuple:
        async with AsyncRolloutClient(server.address, ClientOptions(token=TOKEN, timeout=60)) as c:
            result = await c.generate(["1+2="], GREEDY)
            streamed = [s async for s in c.generate_stream(["1+2=", "3"], GREEDY)]
            tasks = [
                item async for item in c.run_tasks([TASK], SamplingParams(max_tokens=3, n=2, seed=0), EXACT)
            ]
            info = await c.get_info()
            err = None
            try:
                await c.generate([], GREEDY)
            except RpcError as e:
                err = e
            return result, streamed, tasks, info, err

    result, streamed, tasks, info, err = asyncio.run(run())
    assert result.completions == client.generate(["1+2="], GREEDY).completions
    assert [(s.prompt_index, s.sample_index) for s in streamed] == [(0, 0), (1, 0)]
    assert [i for i, _ in tasks] == [0] and len(tasks[0][1]) == 2 and tasks[0][1][0].group_id == "t0"
    assert info.engine == "hf"
    assert (
        err is not None
        and err.code == grpc.StatusCode.INVALID_ARGUMENT
        and err.details.startswith("prompts:")
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_retries_until_the_server_comes_up(engine: HFEngine) -> None:
    port = _free_port()
    started: list[RpcServer] = []

    def start_later() -> None:
        time.sleep(0.5)
        started.append(_serve(engine, port))

    options = ClientOptions(token=TOKEN, timeout=30, retry_attempts=10, retry_backoff=0.1)
    with RolloutClient(f"127.0.0.1:{port}", options) as c:
        thread = threading.Thread(target=start_later)
        begin = time.monotonic()
        thread.start()
        try:
            result = c.generate(["1+2="], GREEDY)
        finally:
            thread.join()
        elapsed = time.monotonic() - begin
    started[0].stop(grace=0)
    assert len(result.completions[0]) == 1
    assert elapsed >= 0.5  # the first attempts found nobody listening


def test_run_tasks_builds_a_user_workflow_with_its_args(client: RolloutClient) -> None:
    """default_workflow_type by import path: RunTasks carries the workflow's name and args, and the
    worker builds that class with them (here: a bonus added to every reward)."""
    tasks = [Task(f"t{i}", f"{i}+{i}=", answer=str(2 * i)) for i in range(3)]
    sampling = SamplingParams(temperature=0.0, n=2, max_tokens=6)
    bonus = WorkflowSpec(reward_fn=["exact_match"], max_prompt_tokens=64,
                         name="tests.integration.workflows:BonusWorkflow", args={"bonus": 0.25})  # fmt: skip
    plain = [e for _, exps in client.run_tasks(tasks, sampling, EXACT) for e in exps]
    got = [e for _, exps in client.run_tasks(tasks, sampling, bonus) for e in exps]
    assert [e.response_token_ids for e in got] == [e.response_token_ids for e in plain]
    assert [e.reward for e in got] == [e.reward + 0.25 for e in plain]
    assert all(
        e.reward_components == {"exact_match": p.reward, "bonus": 0.25}
        for e, p in zip(got, plain, strict=True)
    )
