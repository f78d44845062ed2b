import pytest
import torch

from rlcore.core.algorithms.aggregation import LOSS_AGG_MODES, LossNorm, aggregate, token_weights

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
NORM = LossNorm.local(MASK, max_response_len=4)


def test_local_counts():
    assert NORM == LossNorm(num_tokens=3.0, num_seqs=2.0, max_response_len=4)
    # a sequence with no loss token is not a sequence of the batch
    padded = torch.cat([MASK, torch.zeros(1, 3)])
    assert LossNorm.local(padded, 4) == NORM


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 seqs
        ("seq-mean-token-mean", 2.75),  # (3/2 + 4/1) / 2
        ("seq-mean-token-sum-norm", 0.875),  # (3/4 + 4/4) / 2
    ],
)
def test_modes(mode, expected):
    assert aggregate(VALUES, MASK, mode, NORM).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_halves_with_global_norm_sum_to_whole(mode):
    torch.manual_seed(0)
    values = torch.randn(4, 5)
    lengths = torch.tensor([5, 1, 3, 2])
    mask = (torch.arange(5) < lengths[:, None]).float()
    norm = LossNorm.local(mask, max_response_len=6)
    whole = aggregate(values, mask, mode, norm)
    halves = aggregate(values[:2], mask[:2], mode, norm) + aggregate(values[2:], mask[2:], mode, norm)
    torch.testing.assert_close(halves, whole)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_token_weights_sum_to_the_aggregate(mode):
    """A service that sums per-token terms (Tinker) gets rlcore's aggregate from these weights."""
    torch.manual_seed(1)
    values = torch.randn(4, 5)
    mask = (torch.arange(5) < torch.tensor([5, 1, 3, 0])[:, None]).float()
    norm = LossNorm.local(mask, max_response_len=6)
    weights = token_weights(mask, mode, norm)
    torch.testing.assert_close((values * weights).sum(), aggregate(values, mask, mode, norm))
    assert (weights[mask == 0] == 0).all()


def test_unknown_mode_lists_valid():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum, .*; got 'sum'"):
        aggregate(VALUES, MASK, "sum", NORM)


def test_empty_batch_is_an_invariant_violation():
    with pytest.raises(AssertionError):
        LossNorm(num_tokens=0.0, num_seqs=0.0, max_response_len=4)
