"""The trainer's routing replay (backends/common/routing.py): a micro-batch's recorded experts reach
each token of the padded and the packed forward, with gradient checkpointing's recompute inside, and
give the log-probs and gradients of the HF model forced to the same experts sequence by sequence."""

from __future__ import annotations

import pytest
import torch

from rlcore.backends.common.hf_model import forward_logprobs
from rlcore.backends.common.routing import replay_routing
from rlcore.core import moe_routing
from rlcore.core.algorithms.logprob import token_logprobs
from rlcore.core.batch import Sequence, pack
from tests.tiny_models import tiny_hf_model

LENGTHS = [(4, 5), (7, 2), (3, 8)]  # (prompt, response) tokens


def _sequences() -> tuple[list[Sequence], list[torch.Tensor]]:
    """Random sequences, each with a record forcing random experts (two distinct per token)."""
    gen = torch.Generator().manual_seed(5)
    seqs, records = [], []
    for p, r in LENGTHS:
        tokens = moe_routing.routing_tokens(p, r)
        record = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(tokens * 4)]).view(
            tokens, 4, 2
        )
        ids = torch.randint(1, 101, (p + r,), generator=gen).tolist()
        seqs.append(Sequence(ids[:p], ids[p:], routed_experts=moe_routing.to_bytes(record)))
        records.append(record)
    return seqs, records


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _reference(
    model: torch.nn.Module, seqs: list[Sequence], records: list[torch.Tensor]
) -> tuple[list, dict]:
    """Each sequence alone through the HF model forced to its record: response log-probs, and the
    gradients of their sum."""
    out = []
    for s, record in zip(seqs, records, strict=True):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        forced = torch.cat([record, record[-1:]])  # the last token: not recorded, routes freely
        valid = torch.arange(ids.shape[1]) < record.shape[0]
        with moe_routing.replayed(model, forced, valid):
            logits = model(input_ids=ids, use_cache=False).logits
            lp = token_logprobs(logits[:, :-1], ids[:, 1:])[0, len(s.prompt_ids) - 1 :]
            lp.sum().backward()
        out.append(lp.detach())
    return out, _grads(model)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_replayed_batch_equals_each_sequence_forced_alone(packed: bool) -> None:
    model = tiny_hf_model("qwen3_moe", tied=False)
    model.train()  # no dropout in this model; train() so that checkpointing recomputes
    seqs, records = _sequences()
    ref_lp, ref_grads = _reference(model, seqs, records)

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = pack(seqs, pad_token_id=0)
    with replay_routing(model, batch, packed, None):  # backward inside: the recompute routes again
        lp, _ = forward_logprobs(model, batch, 1.0, False, packed)
        (lp * batch["loss_mask"]).sum().backward()
    grads = _grads(model)
    for row, (s, ref) in enumerate(zip(seqs, ref_lp, strict=True)):
        p, r = len(s.prompt_ids), len(s.response_ids)
        torch.testing.assert_close(lp[row, p : p + r].detach(), ref, atol=1e-5, rtol=0)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        scale = ref_grads[name].abs().max().clamp(min=1e-6)
        assert (g - ref_grads[name]).abs().max() / scale < 1e-4, name

    # and the replay matters: routed freely, the same batch scores differently
    free, _ = forward_logprobs(model, batch, 1.0, False, packed)
    assert (free - lp).abs().max() > 1e-3


def test_records_of_another_model_are_refused() -> None:
    model = tiny_hf_model("qwen3_moe", tied=False)
    seq = Sequence([1, 2], [3], routed_experts=bytes(2 * 6))  # 6 experts per token; the model routes 4 x 2
    with pytest.raises(
        ValueError, match="hold 6 experts per token, this model routes 4 MoE layers x top_k 2"
    ):
        replay_routing(model, pack([seq], 0), False, None)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_replaying_transformers_own_routing_changes_no_route(packed: bool) -> None:
    """Records of the routing each sequence gets alone (what the HF engine in this dtype records):
    the batch's forward, padded or packed, would have chosen every replayed route itself."""
    model = tiny_hf_model("qwen3_moe", tied=False)
    seqs, _ = _sequences()
    for s in seqs:
        with torch.no_grad(), moe_routing.RoutingRecorder(model) as own:
            model(input_ids=torch.tensor([s.prompt_ids + s.response_ids]), use_cache=False)
        s.routed_experts = moe_routing.to_bytes(
            own.take()[: moe_routing.routing_tokens(len(s.prompt_ids), len(s.response_ids))]
        )
    counts = moe_routing.RoutingCounts()
    with torch.no_grad(), replay_routing(model, pack(seqs, pad_token_id=0), packed, None, counts):
        forward_logprobs(model, pack(seqs, pad_token_id=0), 1.0, False, packed)
    differing, recorded = counts.take()
    assert recorded == sum(moe_routing.routing_tokens(*lengths) for lengths in LENGTHS) * 4
    assert differing == 0
