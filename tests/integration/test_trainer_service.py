"""`rlcore trainer serve` with 2 gloo ranks, driven by TrainerClient from this (separate) process."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import grpc
import pytest
import torch
import yaml

from rlcore.client.base import ClientOptions, RpcError
from rlcore.client.rollout import RolloutClient
from rlcore.client.trainer import TrainerClient, TrainSequence
from rlcore.core.types import Experience, SamplingParams

from .launch_utils import REPO, tiny_grpo_config, wait_for_port_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN_ENV = "RLCORE_TEST_TRAINER_TOKEN"
TOKEN = "trainer-service-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    port_file = str(tmp_path_factory.mktemp("trainer") / "port")
    cmd = [sys.executable, "-m", "rlcore.cli", "trainer", "serve", "--ranks", "2", "--device", "cpu",
           "--threads", "1", "--port", "0", "--port-file", port_file, "--token-env", TOKEN_ENV]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **{TOKEN_ENV: TOKEN}))
    address = wait_for_port_file(port_file, proc, "trainer serve")
    yield proc, address
    if proc.poll() is None:  # test_sigterm did not run (or failed)
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def client(server):
    with TrainerClient(server[1], ClientOptions(token=TOKEN, timeout=120)) as c:
        yield c


@pytest.fixture(scope="module")
def configured(client, tiny_model_path, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("run"))
    cfg = tiny_grpo_config(root, **{"algorithm.optimizer": {"lr": 1e-3, "lr_scheduler_type": "constant"}})
    cfg["model"].update(model_path=tiny_model_path, scratch={"enabled": False})  # max_model_len 48
    answer = client.configure(yaml.safe_dump(cfg), checkpoint_dir=os.path.join(root, "ckpt"), total_steps=100)
    assert (answer.strategy, answer.world_size) == ("fsdp2", 2)
    return client


def _batch(seed: int, n: int, prompt_len: int, response_len: int) -> list[TrainSequence]:
    rng = random.Random(seed)  # char vocabulary: ids 4..86 are ordinary tokens
    return [
        TrainSequence(
            [rng.randrange(4, 87) for _ in range(prompt_len)],
            [rng.randrange(4, 87) for _ in range(response_len)],
        )
        for _ in range(n)
    ]


def _response_logprobs(
    model_path: str, seqs: list[TrainSequence], temperature: float = 1.0
) -> list[list[float]]:
    """log p(response token | everything before it) under the HF model (logits / temperature),
    computed here by hand."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s.prompt_token_ids + s.response_token_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double() / temperature, dim=-1)
            p = len(s.prompt_token_ids)
            # the token at position t is predicted by the logits at t - 1
            out.append([float(logp[t - 1, ids[0, t]]) for t in range(p, ids.shape[1])])
    return out


def test_calls_before_configure_fail_with_failed_precondition(server):
    with TrainerClient(server[1], ClientOptions(token=TOKEN, timeout=30)) as c:
        assert not c.get_state().configured
        with pytest.raises(RpcError) as e:
            c.optim_step()
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "Configure" in e.value.details
        with pytest.raises(RpcError) as e:
            c.forward_backward(_batch(0, 1, 3, 3), "cross_entropy")
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with TrainerClient(server[1], ClientOptions(timeout=30)) as anonymous:
        with pytest.raises(RpcError) as e:
            anonymous.get_state()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_cross_entropy_loss_falls_over_20_steps_and_grpo_loss_matches_hand_value(configured, tiny_model_path):
    c = configured
    start = c.get_state().global_step
    batch = _batch(0, 8, 6, 8)
    losses = []
    for step in range(20):
        fb = c.forward_backward(batch, "cross_entropy")
        losses.append(fb.loss)
        if step == 0:
            # token-mean NLL of the untrained model over the 8 x 8 response tokens
            lps = _response_logprobs(tiny_model_path, batch)
            expected = -sum(sum(lp) for lp in lps) / 64
            assert fb.num_tokens == 64
            assert abs(fb.loss - expected) < 1e-4, (fb.loss, expected)

            # grpo with old log-probs = the current policy's: ratio 1, no clipping, and (policy ==
            # reference) no KL, so the loss is minus the token-mean advantage over masked-in tokens:
            # seq 0: advantage 1.0 on tokens 0, 1, 3 (mask 1101); seq 1: 0.5 - 1.0 + 2.0 (all in)
            # -> -(3 * 1.0 + 1.5) / 6 = -0.75
            seqs = _batch(1, 2, 5, 4)
            seqs[1].response_token_ids = seqs[1].response_token_ids[:3]
            old = _response_logprobs(tiny_model_path, seqs)
            seqs[0].loss_mask, seqs[0].advantages, seqs[0].old_logprobs = [1, 1, 0, 1], [1.0], old[0]
            seqs[1].advantages, seqs[1].old_logprobs = [0.5, -1.0, 2.0], old[1]
            pg = c.forward_backward(seqs, "grpo")
            assert pg.num_tokens == 6
            assert abs(pg.metrics["actor/pg_loss"] - (-0.75)) < 1e-4, pg.metrics
            assert abs(pg.metrics["actor/ppo_kl"]) < 1e-5 and pg.metrics["actor/pg_clipfrac"] == 0.0
            assert abs(pg.metrics["actor/kl_loss"]) < 1e-5
            assert abs(pg.loss - (-0.75)) < 1e-4
        opt = c.optim_step()
        assert opt.global_step == start + step + 1 and opt.lr == pytest.approx(1e-3)
        assert opt.grad_norm > 0
    # measured: 4.51 -> 0.99 (memorising 64 random tokens at lr 1e-3)
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(later < losses[0] for later in losses[10:]), losses
    state = c.get_state()
    assert state.configured and state.global_step == start + 20 and state.world_size == 2
    assert state.model_path == tiny_model_path


def test_train_step_runs_one_rl_step_on_experiences(configured):
    c = configured
    start = c.get_state().global_step
    rng = random.Random(2)
    exps = []
    rewards = [0.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25]
    for i, reward in enumerate(rewards):  # two groups of 4, rewards differ inside each
        prompt = [10 + i // 4] * 4
        response = [rng.randrange(4, 87) for _ in range(5)]
        exps.append(Experience(prompt, response, [-4.0] * 5, reward, group_id=f"g{i // 4}"))
    result = c.train_step(exps)
    # 8 experiences <= train batch (buffer.batch_size 4 x repeat_times 4): one optimizer step
    assert result.global_step == start + 1
    assert result.metrics["rollout/reward_mean"] == pytest.approx(sum(rewards) / 8)  # 3.75 / 8
    assert "actor/pg_loss" in result.metrics and result.metrics["actor/grad_norm"] > 0
    assert c.get_state().global_step == start + 1


def test_compute_logprobs_scores_with_the_trained_policy_or_the_reference(configured, tiny_model_path):
    """5 sequences of different lengths over 2 data-parallel ranks (uneven shares), answered in
    request order: against the trained weights (through an HF export) and the reference model (the
    initial weights), at temperature 0.7."""
    c = configured
    start = c.get_state().global_step
    c.forward_backward(_batch(9, 4, 5, 5), "cross_entropy")
    c.optim_step()  # the policy now differs from the reference
    seqs = [_batch(10 + i, 1, 2 + i, 6 - i)[0] for i in range(5)]
    _, hf = c.save_checkpoint(export_hf=True)
    policy = c.compute_logprobs(seqs, temperature=0.7)
    reference = c.compute_logprobs(seqs, temperature=0.7, reference=True)
    assert c.get_state().global_step == start + 1  # scoring updates nothing
    for got, expected in ((policy, _response_logprobs(hf, seqs, 0.7)),
                          (reference, _response_logprobs(tiny_model_path, seqs, 0.7))):  # fmt: skip
        assert [len(lp) for lp in got] == [len(s.response_token_ids) for s in seqs]
        worst = max(abs(a - b) for g, e in zip(got, expected, strict=True) for a, b in zip(g, e, strict=True))
        assert worst < 1e-4, worst
    assert (
        max(abs(a - b) for p, r in zip(policy, reference, strict=True) for a, b in zip(p, r, strict=True))
        > 1e-3
    )

    for bad, field in (([TrainSequence([], [5, 6])], "sequences[0].prompt_token_ids"),
                       ([TrainSequence([5], [6, 99])], "sequences[0].response_token_ids")):  # fmt: skip
        with pytest.raises(RpcError) as e:
            c.compute_logprobs(bad)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith(f"{field}: ")


def test_checkpoint_exports_a_loadable_model_with_the_trained_weights(configured):
    c = configured
    step = c.get_state().global_step
    path, hf_path = c.save_checkpoint(export_hf=True, explore_step=5)
    assert path.endswith(f"global_step_{step}") and hf_path == os.path.join(path, "hf")
    # the export loads with from_pretrained and holds the trainer's current weights: the same loss
    # here as on the trainer (2 sequences x 4 response tokens)
    batch = _batch(3, 2, 4, 4)
    fb = c.forward_backward(batch, "cross_entropy")
    lps = _response_logprobs(hf_path, batch)
    assert abs(fb.loss - (-sum(sum(lp) for lp in lps) / 8)) < 1e-4
    loaded = c.load_checkpoint()
    assert (loaded.path, loaded.global_step, loaded.explore_step) == (path, step, 5)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sequences": [TrainSequence([5, 6], [7, 8])], "loss": "kto"}, "loss"),
        ({"sequences": [TrainSequence([5, 6], [7, 8])], "loss": "dpo"}, "sequences"),  # not a pair
        ({"sequences": [], "loss": "cross_entropy"}, "sequences"),
        (
            {
                "sequences": [TrainSequence([5], [6, 7], advantages=[1.0], old_logprobs=[-1.0])],
                "loss": "grpo",
            },
            "sequences[0].old_logprobs",
        ),
        (
            {"sequences": [TrainSequence([5], [6, 7]), TrainSequence([5], [6, 87])], "loss": "cross_entropy"},
            "sequences[1].response_token_ids",
        ),
        ({"sequences": [TrainSequence([5], [6, 7])], "loss": "ppo"}, "sequences[0].advantages"),
        ({"sequences": [TrainSequence([5] * 40, [6] * 9)], "loss": "cross_entropy"}, "sequences[0]"),
    ],
)
def test_malformed_forward_backward_is_invalid_argument_naming_the_field(configured, kwargs, field):
    c = configured
    with pytest.raises(RpcError) as e:
        c.forward_backward(**kwargs)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details.startswith(f"{field}: "), e.value.details
    assert c.get_state().configured  # still serving


def test_malformed_configure_and_train_step_are_invalid_argument(configured):
    c = configured
    cases = [
        (lambda: c.configure("model: [", total_steps=1), "config_yaml"),
        (lambda: c.configure("no_such_section: 1", total_steps=1), "config_yaml"),
        (lambda: c.configure("project: x", total_steps=0), "total_steps"),
        (lambda: c.train_step([]), "experiences"),
        (lambda: c.train_step([Experience([5], [6, 7], [-1.0], 1.0, "g")]), "experiences[0].logprobs"),
        (lambda: c.load_checkpoint("/no/such/checkpoint"), "path"),
        (lambda: c.sync_weights(["no-port"]), "endpoints[0]"),
    ]
    for call, field in cases:
        with pytest.raises(RpcError) as e:
            call()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert e.value.details.startswith(f"{field}: "), e.value.details
    # the previous configuration survived the rejected ones
    assert c.forward_backward(_batch(4, 1, 3, 3), "cross_entropy").num_tokens == 3


@pytest.fixture
def rollout_worker(tiny_model_path, tmp_path):
    port_file = str(tmp_path / "rollout_port")
    cmd = [sys.executable, "-m", "rlcore.cli", "rollout", "serve", "--model", tiny_model_path, "--engine", "hf",
           "--device", "cpu", "--threads", "1", "--port", "0", "--port-file", port_file,
           "--token-env", TOKEN_ENV]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **{TOKEN_ENV: TOKEN}))
    address = wait_for_port_file(port_file, proc, "rollout serve")
    yield address
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_sync_weights_makes_a_rollout_worker_serve_the_trained_weights(configured, rollout_worker):
    from transformers import AutoModelForCausalLM

    c = configured
    prompt = [10, 11, 12]
    greedy = SamplingParams(temperature=0.0, n=1, max_tokens=8)
    with RolloutClient(rollout_worker, ClientOptions(token=TOKEN, timeout=120)) as worker:
        served = worker.get_info().policy_version
        before = worker.generate([prompt], greedy).completions[0][0].token_ids
        answer = c.sync_weights([rollout_worker])
        step = c.get_state().global_step
        assert answer.policy_version == max(step, served + 1) == worker.get_info().policy_version
        assert c.get_state().policy_version == answer.policy_version
        # float32 tensors whose sizes are multiples of 16 bytes: the bytes of every parameter
        model = AutoModelForCausalLM.from_pretrained(c.save_checkpoint(export_hf=True)[1])
        assert answer.num_bytes == 4 * sum(p.numel() for p in model.parameters())
        with torch.no_grad():
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, 3:]
        got = worker.generate([prompt], greedy).completions[0][0].token_ids
        assert got == expected.tolist()[: len(got)] and len(got) > 0
        assert got != before, "the trained model decodes like the initial one: the test would prove nothing"
        # a second push of the same step still moves the worker to a newer version
        again = c.sync_weights([rollout_worker])
        assert again.policy_version == answer.policy_version + 1 == worker.get_info().policy_version


def test_sigterm_stops_the_world_with_exit_code_0(server):
    proc, _ = server
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - start < 20


def test_serve_without_token_is_a_one_line_usage_error():
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    cmd = [sys.executable, "-m", "rlcore.cli", "trainer", "serve", "--token-env", TOKEN_ENV]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("rlcore: error: ") and TOKEN_ENV in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
