"""Partial rollouts on the HF engine: a weight update interrupts an engine call at a token, and the
batching engine continues each sequence under the new weights (rollout/batching.py, rollout/gate.py)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlcore.core.config.schema import ScratchModelConfig
from rlcore.core.scratch_model import build_scratch_model
from rlcore.core.types import Completion, SamplingParams
from rlcore.rollout.batching import BatchingEngine
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.gate import GenerationGate

SAMPLING = SamplingParams(temperature=1.0, n=2, max_tokens=24, seed=3, ignore_eos=True)


@pytest.fixture(scope="module")
def new_weights(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Version 1: other weights of the same architecture."""
    path = str(tmp_path_factory.mktemp("models") / "tiny_v1")
    build_scratch_model(path, ScratchModelConfig(enabled=True), max_model_len=256, seed=1)
    return path


def _update_at_forward(engine: HFEngine, gate: GenerationGate, lock: threading.Lock, path: str, at: int) -> list:
    """At the engine's `at`-th forward, a weight update to `path` (version 1) begins, as a worker's
    receiver runs one: close the gate, wait for the engine calls running, load under the lock, open."""
    calls, threads = [0], []

    def update() -> None:
        gate.wait_idle()
        with lock:
            engine.load_checkpoint(path, 1)
        gate.open()

    def hook(module: torch.nn.Module, args: tuple) -> None:
        calls[0] += 1
        if calls[0] == at:
            gate.close()
            threads.append(threading.Thread(target=update))
            threads[-1].start()

    engine.model.register_forward_pre_hook(hook)
    return threads


def _scored(model_path: str, prompt: list[int], tokens: list[int]) -> list[float]:
    """Each response token's log-prob under the weights in `model_path`, teacher-forced (T = 1)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return logprobs.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def test_an_interrupted_sequence_is_what_the_engine_samples_under_each_version(
    tiny_model_path: str, new_weights: str
) -> None:
    engine, lock = HFEngine(tiny_model_path, max_model_len=256), threading.Lock()
    gate = GenerationGate(interrupts=True)
    batching = BatchingEngine(engine, lock, gate)
    prompts = [engine.tokenizer("1+2=", add_special_tokens=False)["input_ids"], [5, 6, 7, 8, 9, 10]]
    updates = _update_at_forward(engine, gate, lock, new_weights, at=7)  # the prefill and 6 decode steps
    results, version = batching.generate_versioned(prompts, SAMPLING)
    for t in updates:
        t.join()
    assert version == 0 and engine.policy_version == 1 and batching.interrupted == 4

    before = HFEngine(tiny_model_path, max_model_len=256).generate(prompts, SAMPLING)
    after = HFEngine(new_weights, max_model_len=256)
    for prompt, samples, references in zip(prompts, results, before, strict=True):
        for c, reference in zip(samples, references, strict=True):
            (_, first), (v, rest) = c.segments
            assert first >= 1 and v == 1 and first + rest == len(c.token_ids) == SAMPLING.max_tokens
            assert c.finish_reason == "length" and c.prompt_token_ids == prompt
            # before: what version 0 samples uninterrupted; after: what version 1 samples from there
            assert c.token_ids[:first] == reference.token_ids[:first]
            more = replace(SAMPLING, n=1, max_tokens=rest)
            (continued,) = after.generate([prompt + c.token_ids[:first]], more)[0]
            assert c.token_ids[first:] == continued.token_ids
            # each token's log-prob is its own version's
            scored = _scored(tiny_model_path, prompt, c.token_ids)[:first] + _scored(new_weights, prompt, c.token_ids)[first:]
            assert c.logprobs == pytest.approx(scored, abs=1e-4)
            assert c.text == after.tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_without_partial_rollouts_the_update_waits_for_the_call(tiny_model_path: str, new_weights: str) -> None:
    engine, lock = HFEngine(tiny_model_path, max_model_len=256), threading.Lock()
    gate = GenerationGate()
    batching = BatchingEngine(engine, lock, gate)
    prompts = [[5, 6, 7, 8, 9, 10]]
    updates = _update_at_forward(engine, gate, lock, new_weights, at=7)
    (samples,), version = batching.generate_versioned(prompts, SAMPLING)
    for t in updates:
        t.join()
    assert version == 0 and engine.policy_version == 1 and batching.interrupted == 0
    reference = HFEngine(tiny_model_path, max_model_len=256).generate(prompts, SAMPLING)[0]
    assert [c.token_ids for c in samples] == [c.token_ids for c in reference]
    assert all(c.segments == [] for c in samples)


def test_a_call_the_gate_closed_before_it_began_samples_each_prompt_n_ways(tiny_model_path: str) -> None:
    """Rows that had not started (tokens so far: none) continue as one prompt's n samples, so the
    samples still differ and are what the engine samples for the prompt."""
    engine, lock = HFEngine(tiny_model_path, max_model_len=256), threading.Lock()
    engine.interrupt = threading.Event()
    engine.interrupt.set()
    (samples,) = engine.generate([[5, 6, 7]], SAMPLING)
    assert [(c.token_ids, c.finish_reason) for c in samples] == [([], "interrupted")] * 2
    gate = GenerationGate(interrupts=True)
    batching = BatchingEngine(engine, lock, gate)
    engine.interrupt = None
    copies: list[Completion] = [replace(c, token_ids=[], logprobs=[]) for c in samples]
    batching._continue(copies, SAMPLING, 0)
    direct = engine.generate([[5, 6, 7]], SAMPLING)[0]
    assert [c.token_ids for c in copies] == [c.token_ids for c in direct]
    assert copies[0].token_ids != copies[1].token_ids
    assert [c.segments for c in copies] == [[(0, 0), (0, SAMPLING.max_tokens)]] * 2


def test_the_gate_counts_the_time_a_generation_call_runs_and_the_span_since_the_first() -> None:
    import time

    gate = GenerationGate()
    assert gate.busy() == (0.0, 0.0)
    with gate.admit(), gate.admit():  # overlapping calls count once
        time.sleep(0.05)
    time.sleep(0.05)  # idle
    with gate.admit():
        time.sleep(0.05)
        running_busy, running_span = gate.busy()  # counted while it runs
    busy, span = gate.busy()
    assert 0.05 <= running_busy < busy and running_span < span
    assert 0.1 <= busy and busy + 0.05 <= span
    time.sleep(0.02)
    assert gate.busy() == (busy, span)  # nothing runs: nothing changes
