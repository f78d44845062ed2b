"""GPU tier of partial rollouts: the HF engine's running batch in CUDA graphs, interrupted by a
weight update at a token boundary, gives back the tokens so far, and the batching engine continues
them under the new weights with the graphs captured before the load. Skipped without a CUDA device."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from rlcore.core.types import SamplingParams
from rlcore.rollout.batching import BatchingEngine
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.gate import GenerationGate
from tests.unit.rollout.test_partial_rollout import _scored, _update_at_forward, new_weights  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]

SAMPLING = SamplingParams(temperature=1.0, n=2, max_tokens=40, seed=3, ignore_eos=True)


def test_the_graph_batch_stops_at_a_token_and_continues_under_the_new_weights(
    tiny_model_path: str,
    new_weights: str,  # noqa: F811
) -> None:
    engine, lock = HFEngine(tiny_model_path, device="cuda", max_model_len=256), threading.Lock()
    assert engine._static is not None  # the CUDA-graph loop
    gate = GenerationGate(interrupts=True)
    batching = BatchingEngine(engine, lock, gate)
    prompts = [engine.tokenizer("1+2=", add_special_tokens=False)["input_ids"], [5, 6, 7, 8, 9, 10]]
    updates = _update_at_forward(engine, gate, lock, new_weights, at=1)  # the update begins at the prefill
    results, version = batching.generate_versioned(prompts, SAMPLING)
    for t in updates:
        t.join()
    assert version == 0 and engine.policy_version == 1 and batching.interrupted == 4

    before = HFEngine(tiny_model_path, device="cuda", max_model_len=256).generate(prompts, SAMPLING)
    after = HFEngine(new_weights, device="cuda", max_model_len=256)
    for prompt, samples, references in zip(prompts, results, before, strict=True):
        for c, reference in zip(samples, references, strict=True):
            (_, first), (v, rest) = c.segments
            assert 1 <= first < SAMPLING.max_tokens and v == 1 and first + rest == len(c.token_ids)
            assert c.token_ids[:first] == reference.token_ids[:first]
            (continued,) = after.generate([prompt + c.token_ids[:first]], replace(SAMPLING, n=1, max_tokens=rest))[0]
            assert c.token_ids[first:] == continued.token_ids
            scored = _scored(tiny_model_path, prompt, c.token_ids)[:first] + _scored(new_weights, prompt, c.token_ids)[first:]
            assert c.logprobs == pytest.approx(scored, abs=1e-3)
