"""Routing records and replay on transformers' own Qwen3-MoE (core/moe_routing.py)."""

import pytest
import torch

from rlcore.core import moe_routing
from tests.tiny_models import tiny_hf_model


def _moe():
    return tiny_hf_model("qwen3_moe", tied=False)


def test_record_is_what_the_routers_chose():
    model = _moe()
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(0))
    chosen = []
    hooks = [
        r.register_forward_hook(lambda m, a, out: chosen.append(out[2])) for r in moe_routing.routers(model)
    ]
    with torch.no_grad(), moe_routing.RoutingRecorder(model) as rec:
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    assert moe_routing.shape_of(model) == (4, 2)
    (record,) = rec.calls
    assert record.shape == (14, 4, 2)
    assert record.dtype == torch.uint8 and torch.equal(record.long(), torch.stack(chosen, dim=1))
    assert torch.equal(moe_routing.from_bytes(moe_routing.to_bytes(record), 4, 2), record)


def test_replaying_its_own_record_changes_nothing():
    model = _moe()
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), moe_routing.RoutingRecorder(model) as rec:
        plain = model(input_ids=ids).logits
    with torch.no_grad(), moe_routing.replayed(model, rec.take(), torch.ones(14, dtype=torch.bool)):
        again = model(input_ids=ids).logits
    assert torch.equal(plain, again)


def test_replay_forces_the_experts_and_the_router_still_learns():
    model = _moe()
    ids = torch.randint(0, 101, (1, 9), generator=torch.Generator().manual_seed(2))
    forced = torch.stack([torch.tensor([3, 0])] * 4).expand(9, 4, 2).clone()  # every token: experts 3, 0
    valid = torch.ones(9, dtype=torch.bool)
    valid[4] = False  # one token routed freely
    # a recorder entered inside the replay sees what the replay made of the routing
    with moe_routing.replayed(model, forced, valid), moe_routing.RoutingRecorder(model) as own:
        out = model(input_ids=ids).logits
        out.square().mean().backward()
    (seen,) = own.calls
    assert torch.equal(seen[valid].long(), forced[valid])
    free = moe_routing.RoutingRecorder(model)
    with torch.no_grad(), free:
        model(input_ids=ids)
    assert torch.equal(seen[4], free.take()[4])  # the free token chose by itself
    for router in moe_routing.routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_a_recorder_entered_twice_is_refused_and_records_whole_after():
    """Entered inside itself, a recorder would hook every router twice and tear each record in two:
    it says so; entered again after it left, it records one whole record a forward."""
    model = _moe()
    ids = torch.randint(0, 101, (1, 5), generator=torch.Generator().manual_seed(3))
    recorder = moe_routing.RoutingRecorder(model)
    with recorder:
        with pytest.raises(RuntimeError, match="active already"):
            recorder.__enter__()
    for _ in range(2):
        with torch.no_grad(), recorder:
            model(input_ids=ids)
    assert [tuple(c.shape) for c in recorder.calls] == [(5, *moe_routing.shape_of(model))] * 2


def test_replay_refuses_a_record_of_another_shape():
    model = _moe()
    with pytest.raises(ValueError, match="does not fit this model"):
        with moe_routing.replayed(
            model, torch.zeros(5, 3, 2, dtype=torch.long), torch.ones(5, dtype=torch.bool)
        ):
            pass
    with pytest.raises(ValueError, match="a record names expert 4, this model has 4: it was recorded by another model"):
        with moe_routing.replayed(model, torch.full((5, 4, 2), 4), torch.ones(5, dtype=torch.bool)):
            pass
    with pytest.raises(ValueError, match="the model routed 5 tokens, the record holds 4"):
        with moe_routing.replayed(
            model, torch.zeros(4, 4, 2, dtype=torch.long), torch.ones(4, dtype=torch.bool)
        ):
            model(input_ids=torch.zeros(1, 5, dtype=torch.long))


def test_a_dense_model_has_no_routers_and_other_routers_are_refused():
    dense = tiny_hf_model("qwen3_gqa", tied=False)
    assert moe_routing.routers(dense) == []
    with pytest.raises(ValueError, match="this Qwen3ForCausalLM has no MoE router to record"):
        moe_routing.RoutingRecorder(dense)

    class MixtralRouter(torch.nn.Module):
        pass

    model = torch.nn.Sequential(MixtralRouter())
    with pytest.raises(ValueError, match="proven for Qwen3MoeTopKRouter .* MixtralRouter"):
        moe_routing.routers(model)
