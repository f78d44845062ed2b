import math

import torch

from rlcore.core.algorithms import logprob as logprob_module
from rlcore.core.algorithms.logprob import entropy_from_logits, token_logprobs


def test_hand_computed():
    # row 0: uniform over 2 -> log p = log 0.5 = -0.6931472, entropy = log 2 = 0.6931472
    # row 1: logits [0, log 3] -> p = [0.25, 0.75]; log p(1) = log 0.75 = -0.2876821;
    #        entropy = 0.25 * log 4 + 0.75 * log(4/3) = 0.3465736 + 0.2157616 = 0.5623351
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3)]]])
    labels = torch.tensor([[0, 1]])
    torch.testing.assert_close(token_logprobs(logits, labels), torch.tensor([[-0.6931472, -0.2876821]]))
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[0.6931472, 0.5623351]]))


def _direct(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def test_matches_direct_computation_with_grads(monkeypatch):
    # a chunk of 10 elements = 2 rows of V=5, so each sequence of T=7 is split into 4 chunks
    monkeypatch.setattr(logprob_module, "_CHUNK_ELEMENTS", 10)
    torch.manual_seed(0)
    logits = (torch.randn(3, 7, 5) * 3).requires_grad_()
    labels = torch.randint(0, 5, (3, 7))
    lp, ent = token_logprobs(logits, labels), entropy_from_logits(logits)
    ref_logits = logits.detach().clone().requires_grad_()
    ref_lp, ref_ent = _direct(ref_logits, labels)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    w_lp, w_ent = torch.randn(3, 7), torch.randn(3, 7)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
    ((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum()).backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)


def test_non_contiguous_logits(monkeypatch):
    monkeypatch.setattr(logprob_module, "_CHUNK_ELEMENTS", 10)
    torch.manual_seed(1)
    full = torch.randn(2, 6, 5)
    logits = full[:, 1:]  # the shifted slice a strategy takes; not contiguous
    assert not logits.is_contiguous()
    labels = torch.randint(0, 5, (2, 5))
    ref_lp, ref_ent = _direct(logits, labels)
    torch.testing.assert_close(token_logprobs(logits, labels), ref_lp)
    torch.testing.assert_close(entropy_from_logits(logits), ref_ent)


def test_bf16_logits_computed_in_float32():
    torch.manual_seed(2)
    logits = (torch.randn(2, 4, 50) * 4).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 4))
    lp, ent = token_logprobs(logits, labels), entropy_from_logits(logits)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    # the reference upcasts the (exactly representable) bf16 values first
    ref_lp, ref_ent = _direct(logits.float(), labels)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    # a bf16 log-softmax would be visibly off: the float32 path is what the test guards
    bf16_lp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    assert (bf16_lp - ref_lp).abs().max() > 1e-3


def test_bf16_grad_flows_back_in_bf16():
    logits = torch.zeros(1, 1, 4, dtype=torch.bfloat16, requires_grad=True)
    token_logprobs(logits, torch.tensor([[2]])).sum().backward()
    # d log p(2) / d logits = onehot(2) - softmax = [-0.25, -0.25, 0.75, -0.25]
    assert logits.grad.dtype == torch.bfloat16
    assert logits.grad.float().tolist() == [[[-0.25, -0.25, 0.75, -0.25]]]


def test_backward_keeps_at_most_one_float32_copy_of_bf16_logits(monkeypatch):
    # 4 chunks per sequence; whatever autograd saves must add up to <= one float32 [B, T, V] copy
    monkeypatch.setattr(logprob_module, "_CHUNK_ELEMENTS", 64 * 2)
    logits = torch.randn(2, 8, 64).to(torch.bfloat16).requires_grad_()
    saved_float32_bytes = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved_float32_bytes
        if t.dtype == torch.float32:
            saved_float32_bytes += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(logits, torch.zeros(2, 8, dtype=torch.long))
    assert 0 < saved_float32_bytes <= 2 * 8 * 64 * 4 + 2 * 8 * 4  # logits copy + logsumexp results
