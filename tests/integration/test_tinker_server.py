"""`rlcore tinker serve` driven by the official `tinker` SDK, unmodified, on loopback: a trainer
world (fsdp2, LoRA) and the HF engine behind the Tinker HTTP API."""

from __future__ import annotations

import numpy as np
import pytest

from .tinker_serving import KEY, MODEL, OTHER

tinker = pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'rlcore[tinker]'")
from tinker import types  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def service(tinker_server):
    client = tinker.ServiceClient(base_url=tinker_server, api_key=KEY)
    yield client
    client.close("success").result()



def _datum(ids: list[int], weights: list[float] | None = None, **inputs) -> types.Datum:
    n = len(ids) - 1
    fields = {"target_tokens": ids[1:], **inputs}
    if weights is not None or not inputs:
        fields["weights"] = weights if weights is not None else [1.0] * n
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=fields)


def _lps(out, i: int = 0) -> np.ndarray:
    return np.asarray(out.loss_fn_outputs[i]["logprobs"].tolist(), dtype=np.float64)


def test_supervised_loop_sampling_and_exact_resume(service) -> None:
    tc = service.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    tok = tc.get_tokenizer()
    texts = ["1+2=3. 4+4=8.", "7*6=42. 9-3=6.", "12+30=42."]
    data = [_datum(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    adam = types.AdamParams(learning_rate=5e-3)
    losses = []
    for _ in range(12):
        fb = tc.forward_backward(data, "cross_entropy")  # queued without waiting, as Tinker loops do
        tc.optim_step(adam)
        out = fb.result()
        # loss:sum is Tinker's sum over tokens of -weight * logprob, the logprobs the learner's
        assert out.metrics["loss:sum"] == pytest.approx(-sum(_lps(out, i).sum() for i in range(3)), rel=1e-5)
        losses.append(out.metrics["loss:sum"])
    assert losses[-1] < 0.8 * losses[0], losses

    # a sampler of the trained weights: its prompt log-probs are the trainer's
    sampler = tc.save_weights_and_get_sampling_client().result()
    ids = tok(texts[0], add_special_tokens=False)["input_ids"]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    learner = _lps(tc.forward([_datum(ids)], "cross_entropy").result())
    assert scored[0] is None and np.allclose(scored[1:], learner, atol=1e-5)
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    got = sampler.sample(types.ModelInput.from_ints(ids[:4]), num_samples=3, sampling_params=params).result()
    assert len(got.sequences) == 3
    for s in got.sequences:
        assert 1 <= len(s.tokens) <= 12 and len(s.logprobs) == len(s.tokens)
        assert s.stop_reason == ("length" if len(s.tokens) == 12 else "stop")
    again = sampler.sample(types.ModelInput.from_ints(ids[:4]), num_samples=3, sampling_params=params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in got.sequences]  # seeded
    burst = [sampler.sample(types.ModelInput.from_ints(ids[:4]), num_samples=3, sampling_params=params) for _ in range(4)]
    for f in burst:  # concurrent requests share engine calls and sample as they would alone
        assert [s.tokens for s in f.result().sequences] == [s.tokens for s in got.sequences]

    # a training checkpoint resumes exactly: the same next steps from the saved state, twice
    path = tc.save_state("mid").result().path
    assert path.endswith("/weights/mid")

    def next_losses(client) -> list[float]:
        out = []
        for _ in range(2):
            fb = client.forward_backward(data, "cross_entropy")
            client.optim_step(adam).result()
            out.append(fb.result().metrics["loss:sum"])
        return out

    first = next_losses(tc)
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert next_losses(resumed) == pytest.approx(first, rel=1e-6, abs=1e-6)
    # the first model still trains beside the second (they take turns): both hold the same weights now
    assert np.allclose(_lps(tc.forward([data[0]], "cross_entropy").result()),
                       _lps(resumed.forward([data[0]], "cross_entropy").result()), atol=1e-5)  # fmt: skip


def test_policy_losses_are_tinkers_sums(service) -> None:
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
    ids = tc.get_tokenizer()("3+4=7 and 5+5=10", add_special_tokens=False)["input_ids"]
    n = len(ids) - 1
    rng = np.random.default_rng(0)
    sampled = (-4.0 + 0.3 * rng.standard_normal(n)).tolist()
    adv = np.where(np.arange(n) >= 4, rng.standard_normal(n), 0.0).tolist()
    datum = _datum(ids, logprobs=sampled, advantages=adv)
    for loss, config in (("importance_sampling", None), ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
                         ("cispo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})):  # fmt: skip
        out = tc.forward_backward([datum], loss, loss_fn_config=config).result()
        lp, a, ratio = _lps(out), np.asarray(adv), np.exp(_lps(out) - np.asarray(sampled))
        lo, hi = (config or {}).get("clip_low_threshold", 0), (config or {}).get("clip_high_threshold", np.inf)
        expected = {
            "importance_sampling": -(ratio * a).sum(),
            "ppo": np.maximum(-a * ratio, -a * np.clip(ratio, lo, hi)).sum(),
            "cispo": -(np.clip(ratio, lo, hi) * a * lp).sum(),
        }[loss]
        assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5), loss
    # gspo: the sequence ratio over sequence_ratio_mask, the sum over every position (advantages at 4, 5 too)
    in_ratio = np.arange(n) >= 6
    gspo = _datum(ids, logprobs=sampled, advantages=adv, sequence_ratio_mask=in_ratio.astype(float).tolist())
    out = tc.forward_backward(
        [gspo], "gspo", loss_fn_config={"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    )
    lp, a = _lps(out.result()), np.asarray(adv)
    s = np.exp((lp - np.asarray(sampled))[in_ratio].mean())
    expected = np.maximum(-a * s, -a * np.clip(s, 0.9, 1.1)).sum()
    assert out.result().metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert np.isfinite(tc.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm:mean"])


def test_bad_requests_are_the_sdks_errors_and_the_server_keeps_serving(service, tinker_server) -> None:
    tc = service.create_lora_training_client(base_model=MODEL, rank=4).result()
    ids = tc.get_tokenizer()("2+2=4", add_special_tokens=False)["input_ids"]
    good = _datum(ids)
    with pytest.raises(tinker.BadRequestError, match="loss_fn: dro is not served"):
        tc.forward_backward([good], "dro").result()
    short = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:3], "weights": [1.0, 1.0]})  # fmt: skip
    with pytest.raises(tinker.BadRequestError, match=r"shape \[2\]; it needs one entry per model_input token"):
        tc.forward_backward([short], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="advantages missing"):
        tc.forward_backward([good], "importance_sampling").result()
    with pytest.raises(tinker.BadRequestError, match=r"create_model: a rank-8192 adapter of rlcore/tiny trains "
                       r"[0-9.]+ MB of weights and optimizer state; this server allows 64 MB per model"):  # fmt: skip
        service.create_lora_training_client(base_model=MODEL, rank=8192).result()
    with pytest.raises(tinker.BadRequestError, match="base_model: nobody/none is not served"):
        service.create_lora_training_client(base_model="nobody/none", rank=4).result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        service.create_sampling_client(model_path="tinker://x:train:0/sampler_weights/none").result()
    with pytest.raises(tinker.AuthenticationError, match="X-API-Key"):
        tinker.ServiceClient(base_url=tinker_server, api_key="tml-wrong").create_lora_training_client(
            base_model=MODEL, rank=4
        ).result()
    tc.save_weights_for_sampler("once").result()
    with pytest.raises(tinker.BadRequestError, match="exists; save under another name"):
        tc.save_weights_for_sampler("once").result()
    silent = _datum(ids, weights=[0.0] * (len(ids) - 1))  # nothing to train: loss 0, not an error
    assert tc.forward_backward([silent], "cross_entropy").result().metrics["loss:sum"] == 0.0
    out = tc.forward_backward([good], "cross_entropy").result()  # still serving
    assert out.metrics["loss:sum"] > 0


def test_a_custom_loss_an_unembedding_adapter_the_rest_listings_and_prompt_top_k(service, tinker_server) -> None:
    """What programs written for the SDK also use: forward_backward_custom (a DPO loss computed on the
    client, whose weights have both signs) trains and its loss falls; an adapter on the unembedding
    alone trains (train_unembed honoured); the RestClient lists the run and its checkpoints, tells
    their adapter and deletes one (a sampler of it then says so, naming no server path); a sampler
    gives the prompt's top-k log-probs."""
    import torch

    tc = service.create_lora_training_client(
        base_model=MODEL, rank=4, seed=2, train_attn=False, train_mlp=False, train_unembed=True
    ).result()
    tok = tc.get_tokenizer()
    data = []
    for prompt, chosen, rejected in (("2+3=", "5.", "6."), ("4+4=", "8.", "9."), ("7+1=", "8.", "7.")):
        n = len(tok(prompt, add_special_tokens=False)["input_ids"])
        for answer in (chosen, rejected):  # the answer's tokens weigh, the prompt's do not
            ids = tok(prompt + answer, add_special_tokens=False)["input_ids"]
            data.append(_datum(ids, [0.0] * (n - 1) + [1.0] * (len(ids) - n)))
    fwd = tc.forward(data, "cross_entropy").result()
    reference = [torch.tensor(_lps(fwd, i)) for i in range(len(data))]

    def dpo(batch, logprobs):
        margin = []
        for i in range(0, len(batch), 2):
            chosen, rejected = (
                ((logprobs[j] - reference[j]) * torch.tensor(batch[j].loss_fn_inputs["weights"].tolist())).sum()
                for j in (i, i + 1)
            )
            margin.append(chosen - rejected)
        loss = -torch.nn.functional.logsigmoid(2.0 * torch.stack(margin)).mean()
        return loss, {"dpo_loss": float(loss.detach())}

    losses = []
    for _ in range(6):
        fb = tc.forward_backward_custom(data, dpo)
        tc.optim_step(types.AdamParams(learning_rate=2e-2))
        losses.append(fb.result().metrics["dpo_loss"])
    assert losses[0] == pytest.approx(np.log(2), abs=1e-4) and losses[-1] < 0.9 * losses[0], losses

    rest = tinker.RestClient(base_url=tinker_server, api_key=KEY)
    model_id = tc.model_id
    state = tc.save_state("dpo").result().path
    sampler_path = tc.save_weights_for_sampler("dpo-sampler").result().path
    run = rest.get_training_run(model_id).result()
    assert (run.training_run_id, run.is_lora, run.lora_rank) == (model_id, True, 4)
    assert run.last_checkpoint.tinker_path == state
    assert run.last_sampler_checkpoint.tinker_path == sampler_path
    assert model_id in [r.training_run_id for r in rest.list_training_runs(limit=100).result().training_runs]
    listed = rest.list_checkpoints(model_id).result().checkpoints
    assert [(c.checkpoint_id, c.checkpoint_type) for c in listed] == [
        ("weights/dpo", "training"), ("sampler_weights/dpo-sampler", "sampler")
    ]
    assert all(c.size_bytes and c.size_bytes > 0 for c in listed)
    assert {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints} >= {state, sampler_path}
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.lora_rank, info.train_unembed, info.train_mlp) == (MODEL, 4, True, False)

    # the prompt's top-k: the likeliest first, each position's own token's log-prob among them or below
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    ids = tok("4+4=8.", add_special_tokens=False)["input_ids"]
    out = sampler.sample(types.ModelInput.from_ints(ids), 1, types.SamplingParams(max_tokens=2, seed=0),
                         include_prompt_logprobs=True, topk_prompt_logprobs=3).result()  # fmt: skip
    assert out.topk_prompt_logprobs[0] is None and len(out.topk_prompt_logprobs) == len(ids)
    for i in range(1, len(ids)):
        top = out.topk_prompt_logprobs[i]
        assert len(top) == 3 and [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        own = dict(top).get(ids[i])
        assert (own == pytest.approx(out.prompt_logprobs[i], abs=1e-5)) if own is not None else (
            out.prompt_logprobs[i] <= top[-1][1] + 1e-5
        )

    rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    assert [c.checkpoint_id for c in rest.list_checkpoints(model_id).result().checkpoints] == ["weights/dpo"]
    with pytest.raises(tinker.BadRequestError, match="weights it samples were dropped") as dropped:
        sampler.sample(types.ModelInput.from_ints(ids[:3]), 1, types.SamplingParams(max_tokens=2)).result()
    assert "/" not in str(dropped.value).split("dropped")[0].split("sampling_session_id")[-1]
    with pytest.raises(tinker.NotFoundError, match="no training run"):
        rest.get_training_run("nobody:train:0").result()


def _tenant_losses(client, seed: int, steps: int, out: dict) -> None:
    """A LoRA model of `client` trained `steps` steps on its own data: its losses in out[seed]."""
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=seed).result()
    tok = tc.get_tokenizer()
    data = [_datum(tok(t, add_special_tokens=False)["input_ids"]) for t in (f"{seed}+{seed}={2 * seed}.", "9*9=81.")]
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=2e-3 * seed))
        losses.append(fb.result().metrics["loss:sum"])
    out[seed] = losses


def test_two_clients_train_two_models_at_once_as_each_trains_alone(tinker_server) -> None:
    """Two official-SDK clients (sessions of their own) train a LoRA model each on one server at once,
    their requests interleaved: each model's losses are its single-tenant run's (the models take turns
    on the trainer world, each with its own adapter and optimizer state)."""
    import threading

    def session():
        return tinker.ServiceClient(base_url=tinker_server, api_key=KEY)

    alone: dict = {}
    for seed in (3, 5):  # each alone, one after the other
        client = session()
        _tenant_losses(client, seed, 4, alone)
        client.close("success").result()
    together: dict = {}
    clients = [session(), session()]
    threads = [threading.Thread(target=_tenant_losses, args=(c, seed, 4, together)) for c, seed in zip(clients, (3, 5), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert set(together) == {3, 5}, "a client did not finish"
    for seed in (3, 5):
        assert together[seed] == pytest.approx(alone[seed], rel=1e-6, abs=1e-6), seed
        assert together[seed][-1] < together[seed][0]
    for client in clients:
        client.close("success").result()


def test_a_key_reaches_only_what_it_created(service, tinker_server) -> None:
    """Each key the server takes is a tenant: another key can neither read nor sample a model, its
    checkpoints or its samplers (404, as if they did not exist), and lists only its own."""
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=7).result()
    ids = tc.get_tokenizer()("1+1=2.", add_special_tokens=False)["input_ids"]
    path = tc.save_weights_for_sampler("private").result().path
    state = tc.save_state("private").result().path
    other = tinker.ServiceClient(base_url=tinker_server, api_key=OTHER)
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        other.create_sampling_client(model_path=path).result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        other.create_training_client_from_state(state).result()
    theirs = tinker.RestClient(base_url=tinker_server, api_key=OTHER)
    with pytest.raises(tinker.NotFoundError):
        theirs.get_training_run(tc.model_id).result()
    with pytest.raises(tinker.NotFoundError):
        theirs.get_weights_info_by_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError):
        theirs.delete_checkpoint_from_tinker_path(path).result()
    assert not {c.tinker_path for c in theirs.list_user_checkpoints().result().checkpoints} & {path, state}

    own = other.create_lora_training_client(base_model=MODEL, rank=4, seed=7).result()  # its own trains
    assert own.forward([_datum(ids)], "cross_entropy").result().metrics["loss:sum"] > 0
    assert [r.training_run_id for r in theirs.list_training_runs(limit=100).result().training_runs] == [own.model_id]
    mine = tinker.RestClient(base_url=tinker_server, api_key=KEY).list_training_runs(limit=100).result().training_runs
    assert tc.model_id in {r.training_run_id for r in mine} and own.model_id not in {r.training_run_id for r in mine}
    sampler = service.create_sampling_client(model_path=path).result()  # the owner samples as before
    assert sampler.sample(types.ModelInput.from_ints(ids[:3]), 1, types.SamplingParams(max_tokens=2)).result()
    other.close("success").result()
