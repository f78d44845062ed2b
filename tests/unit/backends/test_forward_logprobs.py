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
