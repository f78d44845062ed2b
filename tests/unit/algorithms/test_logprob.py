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


def test_rows_sampled_at_different_temperatures_score_as_each_would_alone(tiny_model_path):
    """A batch whose rows carry their own temperatures (a mixture's) gives each row the log-probs
    (and entropy) it gets in a batch of one at its temperature; 0 (greedy) is the raw logits."""
    from transformers import AutoModelForCausalLM

    from rlcore.backends.common.hf_model import forward_logprobs
    from rlcore.core.algorithms.logprob import TEMPERATURE

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5], [4, 6, 8, 10, 12]])
    temps = [0.5, 1.0, 0.0]
    with torch.no_grad():
        mixed, mixed_ent = forward_logprobs(model, {"input_ids": ids, TEMPERATURE: torch.tensor(temps)}, 1.0, True)
        for r, t in enumerate(temps):
            alone, alone_ent = forward_logprobs(model, {"input_ids": ids[r : r + 1]}, t, True)
            torch.testing.assert_close(mixed[r : r + 1], alone, rtol=0, atol=1e-6)
            torch.testing.assert_close(mixed_ent[r : r + 1], alone_ent, rtol=0, atol=1e-6)
        one, _ = forward_logprobs(model, {"input_ids": ids}, 1.0, False)
    assert not torch.allclose(mixed[0], one[0])  # 0.5 is not 1.0: the field is read
