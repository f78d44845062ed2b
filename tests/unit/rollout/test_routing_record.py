"""The HF engine's routing records (rollout routing replay): the experts its decode loop routed each
token to, against transformers' own routing of the finished sequence in one plain forward."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlcore.core import moe_routing
from rlcore.core.types import SamplingParams
from rlcore.rollout.engines.hf_decode import decode, decode_static
from tests.tiny_models import tiny_hf_model


def test_the_decode_loops_record_is_transformers_routing_of_the_sequence() -> None:
    model = tiny_hf_model("qwen3_moe", tied=False)
    layers, top_k = moe_routing.shape_of(model)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 101, (length,), generator=gen).tolist() for length in (3, 9, 6)]
    sampling = SamplingParams(temperature=1.0, max_tokens=12, n=3)
    # a token the model emits often ends rows at different steps, so rows leave the batch
    recorder = moe_routing.RoutingRecorder(model)  # entered by the batch around its forwards
    rows = decode(model, prompts, 3, sampling, eos_token_ids=[7, 19, 42], pad_token_id=0,
                  stop_matcher=None, row_seeds=list(range(9)), routing=recorder)  # fmt: skip
    assert rows.routed_experts is not None and len(rows.routed_experts) == 9
    assert len({len(t) for t in rows.tokens}) > 1, "every row ended at the same step"
    assert not recorder.calls, "a forward's record was left unread"
    for row, (tokens, record) in enumerate(zip(rows.tokens, rows.routed_experts, strict=True)):
        prompt = prompts[row // 3]
        engine = moe_routing.from_bytes(record, layers, top_k)
        assert engine.shape[0] == moe_routing.routing_tokens(len(prompt), len(tokens))
        with torch.no_grad(), moe_routing.RoutingRecorder(model) as plain:
            model(input_ids=torch.tensor([prompt + tokens]))
        # the expert sets (top-k order is the router's: equal probabilities could swap it)
        assert torch.equal(engine.sort(-1).values, plain.take()[:-1].sort(-1).values), f"row {row}"


def test_no_record_unless_asked() -> None:
    model = tiny_hf_model("qwen3_moe", tied=False)
    rows = decode(model, [[5, 6, 7]], 1, SamplingParams(temperature=0.0, max_tokens=4),
                  eos_token_ids=[-1], pad_token_id=0, stop_matcher=None)  # fmt: skip
    assert rows.routed_experts is None


def test_engines_without_records_refuse_to_be_asked_for_them() -> None:
    import pytest

    from rlcore.rollout.engines.base import refuse_routed_experts

    refuse_routed_experts(SamplingParams(), "vllm")  # not asked: nothing to refuse
    with pytest.raises(ValueError, match="the vllm engine does not record the experts .* use the hf engine"):
        refuse_routed_experts(SamplingParams(return_routed_experts=True), "vllm")


def test_the_static_loop_records_what_the_eager_loop_records() -> None:
    """The static loop (rows kept in the batch, the step's router choices copied into a buffer, as a
    captured CUDA graph replays them; here without graphs) against the eager loop's hooks."""
    from rlcore.rollout.engines.hf_static import StaticDecodeStates

    model = tiny_hf_model("qwen3_moe", tied=False)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, 101, (length,), generator=gen).tolist() for length in (5, 2, 8)]
    sampling = SamplingParams(temperature=1.0, max_tokens=10, n=2)
    options = dict(eos_token_ids=[7, 19, 42], pad_token_id=0, stop_matcher=None, row_seeds=list(range(6)))
    eager = decode(model, prompts, 2, sampling, routing=moe_routing.RoutingRecorder(model), **options)
    states = StaticDecodeStates(model, max_batch_size=8, max_model_len=64, use_graphs=False)
    static = decode_static(states, prompts, 2, sampling, check_every=3, routing=True, **options)
    assert static.tokens == eager.tokens and static.finish_reasons == eager.finish_reasons
    assert static.routed_experts is not None and eager.routed_experts is not None
    layers, top_k = moe_routing.shape_of(model)
    for a, b in zip(static.routed_experts, eager.routed_experts, strict=True):
        x, y = moe_routing.from_bytes(a, layers, top_k), moe_routing.from_bytes(b, layers, top_k)
        assert torch.equal(x.sort(-1).values, y.sort(-1).values)
    plain = decode_static(states, prompts, 2, sampling, check_every=3, **options)
    assert plain.routed_experts is None and plain.tokens == static.tokens


def test_the_static_running_batch_records_what_each_request_records_alone() -> None:
    """Requests joining a running batch in the static cache's slots at different steps (the step's
    router choices gathered back from the slots; the host looking at ends every third step): each
    request's records are those of the eager loop decoding it alone, and no forward is left on
    the recorder."""
    from rlcore.rollout.engines.hf_running import RunningBatch
    from rlcore.rollout.engines.hf_static import StaticDecodeStates
    from rlcore.rollout.engines.hf_static_batch import StaticRows

    model = tiny_hf_model("qwen3_moe", tied=False)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 101, (length,), generator=gen).tolist() for length in (5, 2, 8)]
    samplings = [SamplingParams(temperature=1.0, max_tokens=m, n=2) for m in (10, 6, 12)]
    eos, pad = [7, 19, 42], 0
    alone = [
        decode(model, [p], 2, s, eos_token_ids=eos, pad_token_id=pad, stop_matcher=None,
               row_seeds=[10 * i, 10 * i + 1], routing=moe_routing.RoutingRecorder(model))
        for i, (p, s) in enumerate(zip(prompts, samplings, strict=True))
    ]  # fmt: skip
    recorder = moe_routing.RoutingRecorder(model)
    states = StaticDecodeStates(model, max_batch_size=8, max_model_len=64, use_graphs=False)
    batch = RunningBatch(model, eos_token_ids=eos, pad_token_id=pad, routing=recorder,
                         kv=StaticRows(states, record=True), sync_every=3)  # fmt: skip
    groups = []
    with torch.inference_mode():
        for step in range(40):
            if step % 2 == 0 and len(groups) < len(prompts):
                i = len(groups)
                groups.append(batch.add([prompts[i]], 2, samplings[i], row_seeds=[10 * i, 10 * i + 1]))
            if batch.rows:
                batch.step()
    assert all(g.done for g in groups) and not recorder.calls
    layers, top_k = moe_routing.shape_of(model)
    for g, ref in zip(groups, alone, strict=True):
        got = g.decoded()
        assert got.tokens == ref.tokens and got.finish_reasons == ref.finish_reasons
        assert got.routed_experts is not None and ref.routed_experts is not None
        for a, b in zip(got.routed_experts, ref.routed_experts, strict=True):
            x, y = moe_routing.from_bytes(a, layers, top_k), moe_routing.from_bytes(b, layers, top_k)
            assert torch.equal(x.sort(-1).values, y.sort(-1).values)


@pytest.fixture(scope="module")
def moe_engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model
    from rlcore.rollout.engines.hf import HFEngine

    path = str(tmp_path_factory.mktemp("models") / "qwen3_moe")
    build_scratch_model(path, ScratchModelConfig(enabled=True, architecture="qwen3_moe"), max_model_len=256, seed=0)
    return HFEngine(path, max_model_len=256)


@pytest.mark.parametrize("template", [None, "thinking"], ids=["appended", "re-rendered"])
def test_a_conversations_record_joins_its_engine_calls(moe_engine: Any, template: str | None) -> None:
    """multi_turn with r3: each token's experts as the engine call that first ran it routed them (the
    prompt and an observation by the next call's prefill, a reply by its decode), which is
    transformers' routing of the whole sample in one forward; a sample the thinking template started
    anew records from its own prompt on."""
    from rlcore.core.scratch_model import CHATML_THINKING_TEMPLATE
    from rlcore.core.types import Task
    from rlcore.rollout.rewards.compose import build_reward
    from rlcore.rollout.workflows.multi_turn import MultiTurnWorkflow

    env = "tests.unit.rollout.test_multi_turn:" + ("ToolThenUserEnv" if template else "CountingEnv")
    wf = MultiTurnWorkflow(
        moe_engine, moe_engine.tokenizer, build_reward(["format"], [0.5]), max_prompt_tokens=64,
        apply_chat_template=template is not None, chat_template=CHATML_THINKING_TEMPLATE if template else None,
        args={"env": env, "max_turns": 3},
    )  # fmt: skip
    sampling = SamplingParams(temperature=1.0, n=2, max_tokens=5, seed=7, return_routed_experts=True)
    exps = wf.run([Task("t0", "12+7="), Task("t1", "3+4=")], sampling, 0)
    assert len(exps) == (8 if template else 4)  # the thinking template: 2 samples an episode
    model = moe_engine.model
    layers, top_k = moe_routing.shape_of(model)
    for e in exps:
        record = moe_routing.from_bytes(e.routed_experts, layers, top_k)
        assert record.shape[0] == moe_routing.routing_tokens(len(e.prompt_token_ids), len(e.response_token_ids))
        with torch.no_grad(), moe_routing.RoutingRecorder(model) as plain:
            model(input_ids=torch.tensor([e.prompt_token_ids + e.response_token_ids]))
        assert torch.equal(record.sort(-1).values, plain.take()[:-1].sort(-1).values)
