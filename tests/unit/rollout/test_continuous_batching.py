"""Continuous batching in the HF engine (engines/hf_running.py, HFBatch) and the batching engine's
loop over it (batching.py): requests with different sampling settings share one running batch,
join it at token boundaries, leave it when they end, and each samples what it samples alone."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlcore.core.types import SamplingParams
from rlcore.rollout.batching import BatchingEngine
from rlcore.rollout.engines.hf import HFEngine

pytestmark = pytest.mark.timeout(300)

MIXED = [
    SamplingParams(n=1, temperature=1.0, max_tokens=9, seed=1),
    SamplingParams(n=3, temperature=0.7, top_p=0.8, max_tokens=14, seed=2),
    SamplingParams(n=1, temperature=0.0, max_tokens=6),
    SamplingParams(n=2, temperature=0.0, max_tokens=5, repetition_penalty=1.3),
    SamplingParams(n=2, temperature=1.2, top_k=5, min_p=0.05, max_tokens=12, seed=3, min_tokens=4),
    SamplingParams(n=1, temperature=1.0, max_tokens=20, seed=4, presence_penalty=0.5, frequency_penalty=0.4),
    SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=5, stop=["1"], logit_bias={7: 3.0}),
    SamplingParams(n=1, temperature=0.9, max_tokens=11, seed=6, ignore_eos=True, stop_token_ids=[9]),
]
"""One request each: every setting a row samples under, different in each."""


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> HFEngine:
    torch.set_num_threads(1)
    return HFEngine(tiny_model_path, max_model_len=256, max_batch_size=64)


@pytest.fixture(scope="module")
def static_engine(tiny_model_path: str) -> HFEngine:
    """The engine over its static cache, as on a GPU (here without CUDA graphs): the running
    batch's rows take slots of it (hf_static_batch.py)."""
    torch.set_num_threads(1)
    return HFEngine(tiny_model_path, max_model_len=256, max_batch_size=64, static_cache=True)


def _prompts(engine: HFEngine) -> list[list[list[int]]]:
    """Request i's prompts: one or two, of different lengths (the joins pad them)."""
    tok = engine.tokenizer
    return [[tok(f"{i}+{i * 7}=")["input_ids"]] + ([tok(f"{i}*{i}*{i}+1=")["input_ids"]] if i % 2 else []) for i in range(len(MIXED))]


def _same(got: list, alone: list) -> None:
    """Request by request, prompt by prompt: token for token, finish reason for finish reason;
    log-probs to float rounding."""
    flat = [c for request in got for cs in request for c in cs]
    refs = [c for request in alone for cs in request for c in cs]
    assert [len(cs) for request in got for cs in request] == [len(cs) for request in alone for cs in request]
    assert [(c.token_ids, c.finish_reason, c.text) for c in flat] == [(c.token_ids, c.finish_reason, c.text) for c in refs]
    for c, ref in zip(flat, refs, strict=True):
        assert c.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_requests_joining_a_running_batch_at_different_steps_each_sample_what_they_sample_alone(
    engine: HFEngine, cache: str, request: pytest.FixtureRequest
) -> None:
    """Requests added one per step (each prefilled while the others decode, its cache laid beside
    theirs or in free slots of the static cache, which grows to hold them), each with its own
    settings: every one's completions are those of the request alone (the eager engine's)."""
    prompts = _prompts(engine)
    alone = [engine.generate(p, s) for p, s in zip(prompts, MIXED, strict=True)]
    batch = (engine if cache == "dynamic" else request.getfixturevalue("static_engine")).continuous_batch()
    assert batch is not None
    ids, done = [], {}
    for p, s in zip(prompts, MIXED, strict=True):
        ids.append(batch.add(p, s))
        done.update(batch.step())
    most_rows = batch.rows
    while batch.rows:
        done.update(batch.step())
    assert most_rows > 4  # several requests did run side by side
    _same([done[i] for i in ids], alone)


def test_static_rows_move_to_a_larger_state_and_back_as_requests_join_and_leave(
    engine: HFEngine, static_engine: HFEngine
) -> None:
    """In the static cache, a request that needs more rows or a longer capacity than the state in
    use moves the running rows to another, and rows that end free slots (taken by the next
    request) and, down to a quarter, move the rest to a smaller state: each request's answer is its
    answer alone all the same."""
    from rlcore.rollout.engines.hf_static_batch import StaticRows

    tok = engine.tokenizer
    plan = [  # (step it joins at, prompt, sampling)
        (0, "1+1=", SamplingParams(temperature=1.0, max_tokens=60, seed=1, ignore_eos=True)),
        (3, "22+3=", SamplingParams(temperature=1.0, n=30, max_tokens=6, seed=2, ignore_eos=True)),
        (5, "7*7=", SamplingParams(temperature=0.8, max_tokens=200, seed=3, ignore_eos=True)),
        (14, "9-4=", SamplingParams(temperature=1.0, n=3, max_tokens=5, seed=4)),
    ]
    alone = [engine.generate([tok(text)["input_ids"]], s) for _, text, s in plan]
    batch = static_engine.continuous_batch()
    assert batch is not None
    ids: dict[int, int] = {}
    done: dict = {}
    shapes = []  # (state rows, capacity, rows running) after each step
    step = 0
    while step == 0 or batch.rows:
        for i, (at, text, s) in enumerate(plan):
            if at == step:
                ids[i] = batch.add([tok(text)["input_ids"]], s)
        done.update(batch.step())
        if batch.rows:
            kv = batch._running.kv
            assert isinstance(kv, StaticRows) and kv.state is not None
            shapes.append((kv.state.batch, kv.state.capacity, batch.rows))
        step += 1
    got = [done[ids[i]] for i in range(len(plan))]
    _same(got, alone)
    states = [(b, c) for b, c, _ in shapes]
    moves = [x for i, x in enumerate(states) if i == 0 or x != states[i - 1]]
    assert moves == [
        (8, 128),  # one row of 60 tokens: the smallest state (MIN_ROWS)
        (32, 128),  # thirty more rows: a larger state
        (32, 256),  # a row of 200 tokens: a longer capacity
        (8, 256),  # the thirty ended: two rows, whose state of 8 is a quarter of 32: a smaller one
    ]
    assert max(rows for b, c, rows in shapes if (b, c) == (8, 256)) == 5  # three more joined the two


def test_a_call_beside_the_static_running_batch_cannot_take_its_state(static_engine: HFEngine) -> None:
    """The engine lock keeps a direct call out while the running batch decodes; one that slipped
    past it would reset the rows' state: it is refused in one line, and served once the batch ended."""
    tok = static_engine.tokenizer
    batch = static_engine.continuous_batch()
    assert batch is not None
    batch.add([tok("1+1=")["input_ids"]], SamplingParams(temperature=1.0, max_tokens=5, seed=1, ignore_eos=True))
    batch.step()
    beside = SamplingParams(temperature=1.0, n=8, max_tokens=5, seed=2)  # the batch's state: 8 rows, 128 columns
    with pytest.raises(RuntimeError, match="held by the engine's running batch"):
        static_engine.generate([tok("2+2=")["input_ids"]], beside)
    while batch.rows:
        batch.step()
    assert len(static_engine.generate([tok("2+2=")["input_ids"]], beside)[0]) == 8


def test_an_interrupt_between_the_hosts_looks_ends_each_row_where_it_was(engine: HFEngine, static_engine: HFEngine) -> None:
    """Rows in the static cache, the host looking at ends every 8th step: an interrupt set at a step
    between ends the request there. Rows that ended at steps the host had not looked at keep their
    own length and "stop"; the others end "interrupted" with their tokens so far. Each row is its
    row decoded alone, or the start of it."""
    from rlcore.rollout.engines.base import prompt_seed
    from rlcore.rollout.engines.hf_running import RunningBatch
    from rlcore.rollout.engines.hf_static_batch import StaticRows

    tok = engine.tokenizer
    prompts = [tok("1+1=")["input_ids"], tok("12*3=")["input_ids"]]
    (stop,) = tok("e", add_special_tokens=False)["input_ids"]  # these rows stop on it at steps 3, 6, 8, 14...
    at = 12
    sampling = SamplingParams(temperature=1.0, n=8, max_tokens=40, seed=5, stop_token_ids=[stop])
    alone = [c for cs in engine.generate(prompts, sampling) for c in cs]
    interrupt = threading.Event()
    e = static_engine
    batch = RunningBatch(e.model, eos_token_ids=e.eos_token_ids, pad_token_id=e.pad_token_id, interrupt=interrupt,
                         kv=StaticRows(e._static), sync_every=8)  # fmt: skip
    seeds = [prompt_seed(sampling.seed, p) + j for p in prompts for j in range(8)]
    with torch.inference_mode():
        group = batch.add(prompts, 8, sampling, row_seeds=seeds)
        for _ in range(at - 1):
            batch.step()
        interrupt.set()
        assert batch.step() == [group]  # step 12, between the host's looks at 8 and 16
    got = group.decoded()
    stopped = [len(t) for t, f in zip(got.tokens, got.finish_reasons, strict=True) if f == "stop"]
    assert any(length % 8 for length in stopped if length < at)  # a row ended where the host did not look
    assert "interrupted" in got.finish_reasons
    for tokens, finish, ref in zip(got.tokens, got.finish_reasons, alone, strict=True):
        if finish == "stop":
            assert tokens == ref.token_ids and ref.finish_reason == "stop"
        else:
            assert finish == "interrupted" and tokens == ref.token_ids[:at]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_concurrent_requests_with_their_own_seeds_and_lengths_share_one_running_batch(
    engine: HFEngine, cache: str, request: pytest.FixtureRequest
) -> None:
    """Eight calls at once, each with its own seed, max_tokens and sampling: one stretch of the
    engine's loop serves them all (one batching-engine "call"), each answer the call's alone."""
    serving = engine if cache == "dynamic" else request.getfixturevalue("static_engine")
    batching = BatchingEngine(serving, threading.Lock())
    prompts = _prompts(engine)
    alone = [engine.generate(p, s) for p, s in zip(prompts, MIXED, strict=True)]
    got: list = [None] * len(MIXED)
    barrier = threading.Barrier(len(MIXED))

    def call(i: int) -> None:
        barrier.wait()
        got[i] = batching.generate_versioned(prompts[i], MIXED[i], linger_s=0.3)[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(MIXED))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert batching.calls == 1
    _same(got, alone)


def test_a_short_request_arriving_during_a_long_one_finishes_long_before_it(engine: HFEngine) -> None:
    """The short request joins the running batch at the next token instead of waiting for the long
    one to end: it is back while the long one still decodes."""
    batching = BatchingEngine(engine, threading.Lock())
    tok = engine.tokenizer
    long = SamplingParams(temperature=1.0, max_tokens=200, seed=1, ignore_eos=True)
    short = SamplingParams(temperature=1.0, max_tokens=4, seed=2)
    forwards = threading.Semaphore(0)
    hook = engine.model.register_forward_hook(lambda *_: forwards.release())
    result: list = []
    try:
        runner = threading.Thread(target=lambda: result.append(batching.generate([tok("1+1=")["input_ids"]], long)))
        runner.start()
        for _ in range(10):  # the long request is decoding
            assert forwards.acquire(timeout=60)
        (answer,) = batching.generate([tok("2+2=")["input_ids"]], short)[0]
        assert runner.is_alive() and not result  # the long one is still running
        runner.join(120)
    finally:
        hook.remove()
    assert len(answer.token_ids) <= 4 and len(result[0][0][0].token_ids) == 200
    assert batching.calls == 1  # the short one joined the long one's stretch
    assert [answer.token_ids] == [c.token_ids for c in engine.generate([tok("2+2=")["input_ids"]], short)[0]]


def test_a_request_the_engine_refuses_fails_alone(engine: HFEngine) -> None:
    """A request past max_model_len fails with its own one-line error; the one beside it is served."""
    batching = BatchingEngine(engine, threading.Lock())
    tok = engine.tokenizer
    errors: list = []

    def too_long() -> None:
        try:
            batching.generate([tok("1+1=")["input_ids"]], SamplingParams(max_tokens=10_000))
        except ValueError as e:
            errors.append(str(e))

    t = threading.Thread(target=too_long)
    t.start()
    (ok,) = batching.generate([tok("3+3=")["input_ids"]], SamplingParams(temperature=0.0, max_tokens=5))[0]
    t.join(60)
    assert len(ok.token_ids) >= 1
    assert len(errors) == 1 and "exceed max_model_len 256" in errors[0]


def test_a_weight_update_waits_for_the_running_requests_and_admits_none_meanwhile(engine: HFEngine) -> None:
    """The gate closed (a weight update waiting) while a request decodes: it finishes, a request
    arriving meanwhile waits for the gate to open and then runs."""
    from rlcore.rollout.gate import GenerationGate

    lock, gate = threading.Lock(), GenerationGate()
    batching = BatchingEngine(engine, lock, gate)
    tok = engine.tokenizer
    forwards = threading.Semaphore(0)
    hook = engine.model.register_forward_hook(lambda *_: forwards.release())
    first: list = []
    try:
        runner = threading.Thread(target=lambda: first.append(batching.generate_versioned(
            [tok("1+1=")["input_ids"]], SamplingParams(max_tokens=60, seed=1, ignore_eos=True))))  # fmt: skip
        runner.start()
        assert forwards.acquire(timeout=60)
        gate.close()
        second: list = []
        waiter = threading.Thread(target=lambda: second.append(batching.generate_versioned(
            [tok("2+2=")["input_ids"]], SamplingParams(max_tokens=5, seed=2))))  # fmt: skip
        waiter.start()
        runner.join(120)
        with lock:  # the update: the running request is done, the waiting one has not started
            assert first and not second
            engine.policy_version = 7
        time.sleep(0.2)
        assert not second
        gate.open()
        waiter.join(60)
    finally:
        hook.remove()
        engine.policy_version = 0
    assert first[0][1] == 0 and len(first[0][0][0][0].token_ids) == 60
    assert second[0][1] == 7


def test_a_model_with_sliding_window_attention_decodes_without_a_running_batch(tmp_path) -> None:
    """A sliding-window cache's layers keep their own length: the engine offers no running batch
    for such a model, and its decode keeps the cache whole as rows leave (no column trimmed)."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    base = str(tmp_path / "base")
    build_scratch_model(base, ScratchModelConfig(enabled=True), max_model_len=256, seed=0)
    config = MistralConfig(vocab_size=len(AutoTokenizer.from_pretrained(base)), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, sliding_window=8, max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(str(tmp_path / "mistral"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        src = tmp_path / "base" / name
        if src.exists():
            (tmp_path / "mistral" / name).write_bytes(src.read_bytes())
    engine = HFEngine(str(tmp_path / "mistral"), max_model_len=256)
    assert engine.continuous_batch() is None
    prompts = [[5, 6, 7], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
    sampling = SamplingParams(temperature=1.0, n=2, max_tokens=12, seed=1, stop_token_ids=[9, 10, 11])
    results = engine.generate(prompts, sampling)  # rows stop at different steps
    assert [len(cs) for cs in results] == [2, 2]
    assert any(c.finish_reason == "stop" for cs in results for c in cs)
    again = engine.generate(prompts, sampling)
    assert [[c.token_ids for c in cs] for cs in again] == [[c.token_ids for c in cs] for cs in results]


def test_a_continued_sequence_keeps_its_scores_and_alternatives(engine: HFEngine) -> None:
    """Partial rollouts: a sequence interrupted before it began and continued has its prompt's
    log-probs and a top-k list for every token, as one generated whole."""
    from dataclasses import replace

    sampling = SamplingParams(temperature=1.0, n=2, max_tokens=6, seed=3, prompt_logprobs=True, top_logprobs=2)
    prompt = engine.tokenizer("4+4=")["input_ids"]
    batching = BatchingEngine(engine, threading.Lock())
    interrupted = [replace(c, token_ids=[], logprobs=[], top_logprobs=[], prompt_logprobs=[], finish_reason="interrupted")
                   for c in engine.generate([prompt], sampling)[0]]  # fmt: skip
    batching._continue(interrupted, sampling, 0)
    whole = engine.generate([prompt], sampling)[0]
    for c, w in zip(interrupted, whole, strict=True):
        assert c.token_ids == w.token_ids and len(c.top_logprobs) == len(c.token_ids)
        assert c.prompt_logprobs == pytest.approx(w.prompt_logprobs, abs=1e-6) and len(c.prompt_logprobs) == len(prompt) - 1


def test_an_exclusive_holder_gets_the_engine_between_calls(engine: HFEngine) -> None:
    """Work beside generation (a direct Generate, loading an adapter) waiting for the engine lock
    gets it once the running calls end: the running batch admits no call meanwhile."""
    batching = BatchingEngine(engine, threading.Lock())
    tok = engine.tokenizer
    forwards = [0]
    started = threading.Event()

    def count(*_: object) -> None:
        forwards[0] += 1
        started.set()

    hook = engine.model.register_forward_hook(count)
    seen: list[int] = []
    try:
        long = threading.Thread(target=lambda: batching.generate(
            [tok("1+1=")["input_ids"]], SamplingParams(max_tokens=80, seed=1, ignore_eos=True)))  # fmt: skip
        long.start()
        assert started.wait(60)

        def holder() -> None:
            with batching.exclusive():
                seen.append(forwards[0])

        waiting = threading.Thread(target=holder)
        waiting.start()
        while not batching._wanted:  # the holder waits for the lock
            time.sleep(0.005)
        short = threading.Thread(target=lambda: batching.generate([tok("2+2=")["input_ids"]], SamplingParams(max_tokens=3, seed=2)))
        short.start()
        for t in (long, waiting, short):
            t.join(120)
    finally:
        hook.remove()
    assert seen == [80]  # the long call's prefill and 79 decode steps, none of the short call's
    assert forwards[0] > 80
