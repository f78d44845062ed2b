"""GPU tier: rollout routing replay on CUDA. A bfloat16 decode loop records each token's experts; a
float32 trainer model scoring the same responses is closer to the engine's log-probs when it replays
them than when it routes by itself, and replaying them routes every recorded token as recorded.
Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from rlcore.backends.common.hf_model import forward_logprobs
from rlcore.backends.common.routing import replay_routing
from rlcore.core import moe_routing
from rlcore.core.batch import Sequence, pack
from rlcore.core.types import SamplingParams
from rlcore.rollout.engines.hf_decode import decode
from tests.tiny_models import tiny_hf_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]


def test_a_bf16_engines_routing_replayed_by_an_fp32_trainer_closes_the_gap() -> None:
    trainer = tiny_hf_model("qwen3_moe", tied=False).cuda()
    engine = tiny_hf_model("qwen3_moe", tied=False).to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 101, (n,), generator=gen).tolist() for n in (4, 9, 6, 12)]
    rows = decode(engine, prompts, 8, SamplingParams(temperature=1.0, max_tokens=24, n=8),
                  eos_token_ids=[-1], pad_token_id=0, stop_matcher=None, row_seeds=list(range(32)),
                  routing=moe_routing.RoutingRecorder(engine))  # fmt: skip
    assert rows.routed_experts is not None
    seqs = [
        Sequence(prompts[r // 8], tokens, old_logprobs=lps, routed_experts=record)
        for r, (tokens, lps, record) in enumerate(
            zip(rows.tokens, rows.logprobs, rows.routed_experts, strict=True)
        )
    ]
    batch = {k: v.cuda() for k, v in pack(seqs, 0).items()}
    mask = batch["loss_mask"]
    counts = moe_routing.RoutingCounts()
    with torch.no_grad():
        free, _ = forward_logprobs(trainer, batch, 1.0, False, packed=True)
        with replay_routing(trainer, batch, True, None, counts):
            replayed, _ = forward_logprobs(trainer, batch, 1.0, False, packed=True)
    gap_free = float(((free - batch["old_logprobs"]).abs() * mask).sum() / mask.sum())
    gap_replayed = float(((replayed - batch["old_logprobs"]).abs() * mask).sum() / mask.sum())
    differing, recorded = counts.take()
    print(f"gap free {gap_free:.5f} replayed {gap_replayed:.5f}; routes differing {differing} of {recorded}")
    assert recorded > 0
    assert gap_replayed < gap_free or differing == 0  # no route differed: nothing for the replay to close


def test_the_captured_decode_steps_record_what_the_eager_loop_records() -> None:
    """The static loop in CUDA graphs (the step's router choices copied into a buffer the graph
    replays) against the eager loop's hooks, float32, the same seeded tokens."""
    from rlcore.rollout.engines.hf_decode import decode_static
    from rlcore.rollout.engines.hf_static import StaticDecodeStates

    model = tiny_hf_model("qwen3_moe", tied=False).cuda()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 101, (n,), generator=gen).tolist() for n in (5, 2, 8)]
    sampling = SamplingParams(temperature=1.0, max_tokens=20, n=4)
    options = dict(eos_token_ids=[7, 19], pad_token_id=0, stop_matcher=None, row_seeds=list(range(12)))
    eager = decode(model, prompts, 4, sampling, routing=moe_routing.RoutingRecorder(model), **options)
    states = StaticDecodeStates(model, max_batch_size=16, max_model_len=64, use_graphs=True)
    graphs = decode_static(states, prompts, 4, sampling, check_every=4, routing=True, **options)
    assert graphs.tokens == eager.tokens
    (state,) = states._states.values()
    assert any(record for _, record in state.graphs), "no recording graph was captured"
    plain = decode_static(states, prompts, 4, sampling, check_every=4, **options)  # the other graphs
    assert plain.tokens == eager.tokens and plain.routed_experts is None
    assert graphs.routed_experts is not None and eager.routed_experts is not None
    layers, top_k = moe_routing.shape_of(model)
    for a, b in zip(graphs.routed_experts, eager.routed_experts, strict=True):
        x, y = moe_routing.from_bytes(a, layers, top_k), moe_routing.from_bytes(b, layers, top_k)
        assert torch.equal(x.sort(-1).values, y.sort(-1).values)
