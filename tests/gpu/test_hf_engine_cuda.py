"""GPU tier: the HF engine's CUDA-graph decode (static cache, graph replays) against its eager loop on
the same GPU: the same greedy and seeded tokens, the same log-probs, and weights loaded after the
graphs were captured reach them. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from rlcore.core.types import SamplingParams
from rlcore.rollout.engines.hf import HFEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]

TEXTS = ["1+2=", "What is 12*3?", "7", "9-4=", "Compute 3+3 now", "x", "40+2=", "11*11="]


def engines(path: str) -> tuple[HFEngine, HFEngine]:
    graphs = HFEngine(path, device="cuda", max_model_len=256)
    eager = HFEngine(path, device="cuda", max_model_len=256, enforce_eager=True)
    assert graphs._static is not None and eager._static is None
    return graphs, eager


def assert_same(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        for c, d in zip(x, y, strict=True):
            assert c.token_ids == d.token_ids and c.finish_reason == d.finish_reason
            assert max((abs(p - q) for p, q in zip(c.logprobs, d.logprobs, strict=True)), default=0.0) < 1e-4


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=1.0, n=8, max_tokens=48, seed=3),
        SamplingParams(
            temperature=0.7, top_k=8, top_p=0.9, repetition_penalty=1.2, n=3, max_tokens=150, seed=5
        ),
    ],
    ids=["greedy", "seeded", "filters_past_one_view"],
)
def test_graph_decode_equals_the_eager_loop_on_cuda(tiny_model_path: str, sampling: SamplingParams) -> None:
    graphs, eager = engines(tiny_model_path)
    prompts = [graphs.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    first = graphs.generate(prompts, sampling)
    assert_same(first, eager.generate(prompts, sampling))
    assert_same(graphs.generate(prompts, sampling), first)  # replays of the captured graphs
    assert graphs._static is not None and all(s.graphs for s in graphs._static._states.values())


def test_requests_joining_the_graph_engines_running_batch_decode_as_they_do_alone(tiny_model_path: str) -> None:
    """Continuous batching in CUDA graphs (hf_static_batch.py): requests with their own settings
    join the running batch at different steps, their rows in the static cache's slots (moving to a
    larger state as they come, a smaller one as they go); each decodes what the eager engine
    decodes for it alone, and the steps are graph replays."""
    from rlcore.rollout.engines.hf_static_batch import StaticRows

    graphs, eager = engines(tiny_model_path)
    samplings = [
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=1.0, n=8, max_tokens=48, seed=3),
        SamplingParams(temperature=0.7, top_k=8, top_p=0.9, repetition_penalty=1.2, n=3, max_tokens=150, seed=5),
        SamplingParams(temperature=1.0, n=2, max_tokens=12, seed=7, stop=["1"]),
    ]
    prompts = [graphs.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS[: len(samplings)]]
    alone = [eager.generate([p], s) for p, s in zip(prompts, samplings, strict=True)]
    batch = graphs.continuous_batch()
    assert batch is not None
    ids, done, step, kinds = [], {}, 0, set()
    while step == 0 or batch.rows:
        if step % 3 == 0 and len(ids) < len(samplings):
            ids.append(batch.add([prompts[len(ids)]], samplings[len(ids)]))
        done.update(batch.step())
        if batch.rows:
            kinds.add(type(batch._running.kv))
        step += 1
    assert kinds == {StaticRows}
    for i, ref in zip(ids, alone, strict=True):
        assert_same(done[i], ref)
    assert graphs._static is not None and any(s.graphs for s in graphs._static._states.values())


def test_weights_loaded_after_capture_reach_the_graphs(tiny_model_path: str) -> None:
    graphs, eager = engines(tiny_model_path)
    prompts = [graphs.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    before = graphs.generate(prompts, greedy)
    gen = torch.Generator().manual_seed(0)
    new = [
        (k, v.cpu() + 0.05 * torch.randn(v.shape, generator=gen))
        for k, v in graphs.weight_destinations().items()
    ]
    graphs.load_weights(new, policy_version=1)
    eager.load_weights(new, policy_version=1)
    after = graphs.generate(prompts, greedy)
    assert_same(after, eager.generate(prompts, greedy))
    assert [c.token_ids for (c,) in after] != [c.token_ids for (c,) in before]


def test_qwen3_moe_decodes_in_cuda_graphs_as_in_the_eager_loop(tmp_path) -> None:
    """Qwen3-MoE in the static loop: the router's top-k and transformers' expert kernels are captured
    in the graphs (no host sync inside a step), the same tokens and log-probs as the eager loop."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    path = str(tmp_path / "moe")
    spec = ScratchModelConfig(enabled=True, architecture="qwen3_moe", num_experts=4, num_experts_per_tok=2)
    build_scratch_model(path, spec, max_model_len=256, seed=0)
    graphs, eager = engines(path)
    prompts = [graphs.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    for sampling in (
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=1.0, n=4, max_tokens=48, seed=3),
    ):
        first = graphs.generate(prompts, sampling)
        assert_same(first, eager.generate(prompts, sampling))
        assert_same(graphs.generate(prompts, sampling), first)
    assert all(s.graphs for s in graphs._static._states.values())


def test_a_structured_request_on_a_graph_engine_decodes_eagerly_and_holds_to_its_pattern(tiny_model_path: str) -> None:
    """Structured output on the CUDA-graph engine: the request takes the eager loop (its masks are
    drawn per step on the host), the bitmask applies to CUDA logits, and the tokens are the CPU
    engine's (greedy) and each a whole match of the pattern."""
    import re

    from rlcore.core.types import StructuredOutput

    pytest.importorskip("xgrammar", reason="structured output needs xgrammar: pip install 'rlcore[structured]'")
    graphs, _ = engines(tiny_model_path)
    cpu = HFEngine(tiny_model_path, max_model_len=256)
    prompts = [graphs.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    pattern = r"[0-9]{1,3}"
    for sampling in (
        SamplingParams(temperature=0.0, max_tokens=8, structured_output=StructuredOutput("regex", pattern)),
        SamplingParams(temperature=1.0, n=4, max_tokens=8, seed=2, structured_output=StructuredOutput("regex", pattern)),
    ):
        got = graphs.generate(prompts, sampling)
        assert all(re.fullmatch(pattern, c.text) for cs in got for c in cs)
        if sampling.temperature == 0:
            assert [c.token_ids for cs in got for c in cs] == [c.token_ids for cs in cpu.generate(prompts, sampling) for c in cs]
