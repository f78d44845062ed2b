import torch

from rlcore.core.batch import Sequence, deal, equalize, micro_batches, pack, plan_micro_batches, shard


def seq(p: int, r: int, **kw) -> Sequence:
    return Sequence(list(range(1, p + 1)), list(range(100, 100 + r)), **kw)


def test_shard_is_contiguous_and_covers_everything():
    items = list(range(7))
    parts = [shard(items, r, 3) for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]


def test_pack_layout_right_padded_with_target_aligned_fields():
    b = pack(
        [seq(2, 3, old_logprobs=[-1.0, -2.0, -3.0], advantage=0.5), seq(1, 1, old_logprobs=[-4.0])],
        pad_token_id=0,
    )
    assert b["input_ids"].tolist() == [[1, 2, 100, 101, 102], [1, 100, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # position t is the prediction of input_ids[t]: response tokens sit at positions p..p+r-1
    assert b["loss_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert b["old_logprobs"].tolist() == [[0, 0, -1, -2, -3], [0, -4, 0, 0, 0]]
    assert b["advantages"].tolist() == [[0, 0, 0.5, 0.5, 0.5], [0, 0, 0, 0, 0]]


def test_pack_trains_only_the_model_tokens_of_a_multi_turn_response():
    """[model, model, env, model]: the context token stays in input_ids, out of the loss mask."""
    s = seq(2, 4, loss_mask=[1, 1, 0, 1])
    b = pack([s, seq(1, 2)], pad_token_id=0)
    assert b["input_ids"].tolist()[0] == [1, 2, 100, 101, 102, 103]
    assert b["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]]
    assert s.trained_tokens == 3 and seq(1, 2).trained_tokens == 2


def test_plan_micro_batches_respects_padded_token_budget():
    seqs = [seq(2, 2), seq(2, 2), seq(3, 3), seq(1, 1), seq(10, 10)]
    groups = plan_micro_batches(seqs, max_tokens=12)
    # [4,4] -> 2*4=8; adding 6 -> 3*6=18 > 12; [6,2] -> 2*6=12; adding 20 alone
    assert [[s.length for s in g] for g in groups] == [[4, 4], [6, 2], [20]]
    assert sum(len(g) for g in groups) == len(seqs)


def test_equalize_splits_then_pads_with_empty_groups():
    groups = [[seq(1, 1), seq(1, 1), seq(1, 1)]]
    assert [len(g) for g in equalize(groups, 2)] == [1, 2]
    assert [len(g) for g in equalize([[seq(1, 1)]], 3)] == [1, 0, 0]


def test_empty_group_becomes_zero_loss_dummy():
    template = seq(2, 2)
    mbs = micro_batches([[template], []], pad_token_id=0, template=template)
    assert len(mbs) == 2
    assert mbs[1]["loss_mask"].sum() == 0 and torch.equal(mbs[1]["input_ids"], mbs[0]["input_ids"])


def test_packed_budget_counts_real_tokens():
    seqs = [seq(2, 2), seq(2, 2), seq(3, 3), seq(1, 1), seq(10, 10)]
    groups = plan_micro_batches(seqs, max_tokens=12, packed=True)
    # 4 + 4 + (6 > 12) | 6 + 2 | 20 alone
    assert [[s.length for s in g] for g in groups] == [[4, 4], [6, 2], [20]]
    # longest first, first fit: the 2 joins the 6 and the two 4s share a micro-batch
    groups = plan_micro_batches(seqs, max_tokens=12, packed=True, by_length=True)
    assert [[s.length for s in g] for g in groups] == [[20], [6, 4, 2], [4]]
    # padded, by length: shortest first, so that rows of similar length share a micro-batch
    groups = plan_micro_batches(seqs, max_tokens=12, by_length=True)
    assert [[s.length for s in g] for g in groups] == [[2, 4, 4], [6], [20]]


def test_deal_balances_token_counts_over_ranks():
    """A long tail: contiguous shares put the long ones together; the deal balances tokens."""
    lengths = [2000, 1500, 100, 100, 90, 80, 60, 50, 40, 30]
    seqs = [seq(1, n - 1, index=i) for i, n in enumerate(lengths)]
    contiguous = [sum(s.length for s in shard(seqs, r, 2)) for r in range(2)]
    shares = deal(seqs, 2)
    loads = [sum(s.length for s in share) for share in shares]
    assert sorted(s.index for share in shares for s in share) == list(range(len(seqs)))
    assert max(loads) - min(loads) <= 500 < max(contiguous) - min(contiguous)
    assert deal(seqs, 2) == shares  # every rank computes the same deal
    assert deal(seqs[:1], 3)[1:] == [[], []]  # fewer sequences than ranks: empty shares


def _padded(groups) -> tuple[int, int]:
    return len(groups), sum(len(g) * max(s.length for s in g) for g in groups)


def _partitions(items):
    if not items:
        yield []
        return
    for rest in _partitions(items[1:]):
        for k in range(len(rest)):
            yield rest[:k] + [[items[0], *rest[k]]] + rest[k + 1 :]
        yield [[items[0]], *rest]


def test_padded_by_length_takes_the_fewest_micro_batches_then_the_least_padding():
    """Against every grouping of a few sequences: the fewest micro-batches under the padded budget,
    and among those the least padding; never more micro-batches than the in-order plan."""
    import random

    rng = random.Random(0)
    for _ in range(300):
        budget = rng.randint(8, 60)
        seqs = [seq(1, rng.randint(0, 30)) for _ in range(rng.randint(1, 7))]
        got = plan_micro_batches(seqs, budget, by_length=True)
        assert sorted(id(s) for g in got for s in g) == sorted(id(s) for s in seqs)
        fits = [
            p for p in _partitions(seqs) if all(len(g) == 1 or len(g) * max(s.length for s in g) <= budget for g in p)
        ]
        assert _padded(got) == min(_padded(p) for p in fits)
        assert len(got) <= len(plan_micro_batches(seqs, budget))
