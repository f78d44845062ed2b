"""The trainer's per-token log-probs from an HF model on a right-padded batch."""

import torch

from rlcore.backends.common.hf_model import forward_logprobs, load_causal_lm
from rlcore.core.algorithms.logprob import token_logprobs
from rlcore.core.batch import Sequence, pack


def test_causal_attention_on_right_padded_batch_equals_the_padding_mask(tiny_model_path):
    """forward_logprobs leaves the padding mask out; on the real positions of a right-padded batch
    that must give what the masked forward gives."""
    model = load_causal_lm(tiny_model_path).eval()
    gen = torch.Generator().manual_seed(0)
    seqs = [
        Sequence(
            prompt_ids=torch.randint(5, 40, (p,), generator=gen).tolist(),
            response_ids=torch.randint(5, 40, (r,), generator=gen).tolist(),
        )
        for p, r in [(3, 9), (6, 2), (4, 14), (5, 1)]
    ]
    batch = pack(seqs, pad_token_id=0)
    assert not batch["attention_mask"].all()  # the batch has padding to ignore

    with torch.no_grad():
        got, _ = forward_logprobs(model, batch, temperature=0.7, with_entropy=False)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        want = token_logprobs(logits[:, :-1] / 0.7, batch["input_ids"][:, 1:])
    real = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(got[:, 1:][real], want[real], rtol=1e-5, atol=1e-5)


def test_packed_forward_equals_the_padded_one(tiny_model_path):
    """The model run on the real tokens only (packed, position ids restarting per sequence, packed
    attention) gives the padded forward's log-probs, entropies, gradients and a critic's values, 0 at
    padding and at position 0; rows keep their own sampling temperatures."""
    from rlcore.backends.common.attention import use_packed_attention
    from rlcore.backends.common.hf_model import forward_values, load_value_model

    hf = load_causal_lm(tiny_model_path)  # HF's own attention, on the padded batch
    model = load_causal_lm(tiny_model_path)
    use_packed_attention(model)  # one causal attention per sequence, as the strategies run it
    gen = torch.Generator().manual_seed(1)
    shapes = [(5, 30, 1.0), (7, 3, 0.7), (4, 60, 1.0), (3, 1, 1.3)]
    seqs = [
        Sequence(
            torch.randint(5, 40, (p,), generator=gen).tolist(),
            torch.randint(5, 40, (r,), generator=gen).tolist(),
            temperature=t,
        )
        for p, r, t in shapes
    ]
    batch = pack(seqs, pad_token_id=0)
    real = batch["attention_mask"].bool()
    for rows in (batch, {k: v for k, v in batch.items() if k != "temperature"}):
        with torch.no_grad():
            want, want_ent = forward_logprobs(hf, rows, 0.9, with_entropy=True)
            got, got_ent = forward_logprobs(model, rows, 0.9, with_entropy=True, packed=True)
        assert got_ent is not None and want_ent is not None
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
        torch.testing.assert_close(got_ent[real], want_ent[real], rtol=0, atol=1e-5)
        assert not got[~real].any() and not got[:, 0].any()

    grads = []
    # gradient checkpointing recomputes each layer in the backward pass: the packed row's offsets
    # must come back with it (they travel as the model call's keywords)
    recomputed = load_causal_lm(tiny_model_path, gradient_checkpointing=True)
    use_packed_attention(recomputed)
    for m, packed in ((hf, False), (model, True), (recomputed, True)):
        m.train()
        (forward_logprobs(m, batch, 1.0, False, packed=packed)[0] * batch["loss_mask"]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for other in grads[1:]:
        for name, g in grads[0].items():
            assert (other[name] - g).abs().max() <= 1e-4 * g.abs().max(), name

    critic_hf, critic = load_value_model(tiny_model_path, seed=0), load_value_model(tiny_model_path, seed=0)
    use_packed_attention(critic)
    with torch.no_grad():
        values = forward_values(critic_hf, batch), forward_values(critic, batch, packed=True)
    torch.testing.assert_close(values[1][real], values[0][real], rtol=0, atol=1e-5)


def test_packed_attention_refuses_what_it_cannot_apply(tiny_model_path):
    """A model that is not transformers' own, and attention arguments packed attention does not
    apply (a sliding window here), are refused in one line naming the key."""
    import pytest

    from rlcore.backends.common.attention import packed_attention, row_kwargs, use_packed_attention

    class Remote(torch.nn.Module):  # what trust_remote_code loads: the model's own module
        config = load_causal_lm(tiny_model_path).config

    with pytest.raises(ValueError, match=r"^trainer\.use_remove_padding: Remote \(.*\) is not a transformers model"):
        use_packed_attention(Remote())
    model = load_causal_lm(tiny_model_path)
    use_packed_attention(model)
    attn = model.model.layers[0].self_attn
    q = torch.zeros(1, 4, 6, 16)
    with pytest.raises(ValueError, match=r"^trainer\.use_remove_padding: LlamaAttention attends with sliding_window"):
        # as Qwen2 and Mistral pass theirs
        packed_attention(attn, q, q[:, :2], q[:, :2], None, sliding_window=8, **row_kwargs([0, 4, 6]))
