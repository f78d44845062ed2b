"""DPO: the pair loss against values worked out by hand, and the surrogate rlcore trains through
has exactly the gradient of the textbook loss (autograd on the pairs), label smoothing included."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlcore.core.algorithms.dpo import SequenceSurrogate, dpo_pairs


def test_loss_and_metrics_by_hand() -> None:
    # pair 0: chosen gains 1.0 over the reference, rejected loses 1.0 -> z = 0.5 * 2 = 1
    # pair 1: the policy prefers the rejected one by 0.4 -> z = -0.2
    policy = torch.tensor([-1.0, -5.0, -2.0, -2.0])
    reference = torch.tensor([-2.0, -4.0, -2.0, -2.4])
    out = dpo_pairs(policy, reference, beta=0.5)
    want = (-math.log(1 / (1 + math.exp(-1.0))) - math.log(1 / (1 + math.exp(0.2)))) / 2
    assert out.loss == pytest.approx(want)
    assert out.metrics["dpo/accuracy"] == 0.5
    assert out.metrics["dpo/margin"] == pytest.approx((2.0 - 0.4) / 2)
    assert out.metrics["dpo/chosen_reward"] == pytest.approx(0.5 * (1.0 + 0.0) / 2)
    assert out.metrics["dpo/rejected_reward"] == pytest.approx(0.5 * (-1.0 + 0.4) / 2)
    # equal policy and reference: z = 0, the loss is log 2 whatever beta is
    assert dpo_pairs(reference, reference, beta=3.0).loss == pytest.approx(math.log(2))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_surrogate_gradient_is_the_dpo_gradient(label_smoothing: float) -> None:
    torch.manual_seed(0)
    pairs, length, vocab, beta = 3, 5, 7, 0.3
    logits = torch.randn(2 * pairs, length, vocab, requires_grad=True)
    tokens = torch.randint(0, vocab, (2 * pairs, length))
    mask = torch.ones(2 * pairs, length)
    mask[1, 3:] = 0.0  # a shorter rejected response
    ref = torch.randn(2 * pairs)

    def token_logprobs() -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    # textbook: autograd through the pair loss
    sums = (token_logprobs() * mask).sum(-1)
    z = beta * ((sums[0::2] - ref[0::2]) - (sums[1::2] - ref[1::2]))
    loss = (-(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)).mean()
    (want,) = torch.autograd.grad(loss, logits)

    # rlcore: scores without gradients, then the per-token surrogate
    out = dpo_pairs(sums.detach(), ref, beta, label_smoothing)
    assert out.loss == pytest.approx(float(loss), rel=1e-6)
    batch = {"advantages": out.weights.unsqueeze(1).expand(-1, length) * mask, "loss_mask": mask}
    surrogate, _ = SequenceSurrogate()(token_logprobs(), None, batch)
    (got,) = torch.autograd.grad(surrogate, logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_nll_term_adds_the_chosen_tokens_likelihood_gradient() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 3, 5, requires_grad=True)
    tokens = torch.randint(0, 5, (4, 3))
    mask = torch.ones(4, 3)
    ref = torch.randn(4)

    def token_logprobs() -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    sums = (token_logprobs() * mask).sum(-1)
    z = 0.2 * ((sums[0::2] - ref[0::2]) - (sums[1::2] - ref[1::2]))
    nll = -sums[0::2].sum() / 6.0  # two chosen responses of 3 tokens
    loss = -F.logsigmoid(z).mean() + 0.5 * nll
    (want,) = torch.autograd.grad(loss, logits)
    out = dpo_pairs(sums.detach(), ref, 0.2, nll_coef=0.5, chosen_lengths=torch.tensor([3.0, 3.0]), nll_norm="batch_tokens")
    assert out.loss == pytest.approx(float(loss), rel=1e-6)
    assert out.metrics["dpo/chosen_nll"] == pytest.approx(float(nll), rel=1e-6)
    batch = {"advantages": out.weights.unsqueeze(1).expand(-1, 3) * mask, "loss_mask": mask}
    (got,) = torch.autograd.grad(SequenceSurrogate()(token_logprobs(), None, batch)[0], logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_rpo_normalises_each_pairs_nll_by_its_own_chosen_length() -> None:
    """RPO's equation, L = L_DPO + alpha (1/P) sum_p -log pi(y_w^p) / |y_w^p|, with chosen responses of
    2 and 6 tokens: the loss and its gradient per pair; the batch-token mean (TRL's) differs."""
    torch.manual_seed(2)
    logits = torch.randn(4, 6, 5, requires_grad=True)
    tokens = torch.randint(0, 5, (4, 6))
    mask = torch.ones(4, 6)
    mask[0, 2:] = 0.0  # pair 0's chosen response: 2 tokens; pair 1's: 6
    ref = torch.randn(4)

    def token_logprobs() -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    sums = (token_logprobs() * mask).sum(-1)
    z = 0.3 * ((sums[0::2] - ref[0::2]) - (sums[1::2] - ref[1::2]))
    nll = (-sums[0] / 2 - sums[2] / 6) / 2
    loss = -F.logsigmoid(z).mean() + 1.0 * nll
    (want,) = torch.autograd.grad(loss, logits)
    lengths = torch.tensor([2.0, 6.0])
    out = dpo_pairs(sums.detach(), ref, 0.3, nll_coef=1.0, chosen_lengths=lengths)
    assert out.loss == pytest.approx(float(loss), rel=1e-6)
    batch = {"advantages": out.weights.unsqueeze(1).expand(-1, 6) * mask, "loss_mask": mask}
    (got,) = torch.autograd.grad(SequenceSurrogate()(token_logprobs(), None, batch)[0], logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    trl = dpo_pairs(sums.detach(), ref, 0.3, nll_coef=1.0, chosen_lengths=lengths, nll_norm="batch_tokens")
    assert trl.metrics["dpo/chosen_nll"] == pytest.approx(float(-(sums[0] + sums[2]) / 8), rel=1e-6)
    assert abs(trl.loss - out.loss) > 1e-3


def test_a_group_gives_its_best_and_worst_response_as_a_pair_and_a_tie_gives_none() -> None:
    from rlcore.core.algorithms.dpo import best_and_worst
    from rlcore.core.types import Experience

    def exp(reward: float, tokens: list[int]) -> Experience:
        return Experience([1], tokens, [0.0] * len(tokens), reward, "t")

    group = [exp(0.5, [2]), exp(1.0, [3]), exp(0.0, [4]), exp(1.0, [5]), exp(0.0, [6])]
    assert best_and_worst(group) == [group[1], group[2]]  # the first of equals, in group order
    assert best_and_worst([exp(1.0, [2]), exp(1.0, [3])]) is None  # no preference
    assert best_and_worst([exp(1.0, [2]), exp(0.0, [2])]) is None  # the same response twice
