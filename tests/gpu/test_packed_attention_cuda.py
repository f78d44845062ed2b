"""GPU tier: packed attention's one varlen flash-attention call per packed row (bf16 on CUDA) against
its per-sequence SDPA loop (the CPU's path) on the same row: outputs and gradients agree to bf16's
rounding, with grouped KV heads and an empty sequence in the row. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from rlcore.backends.common import attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU tier)"),
]


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_varlen_row_matches_the_per_sequence_loop(kv_heads: int) -> None:
    torch.manual_seed(0)
    lengths = [5, 0, 37, 300, 1, 64]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    n, heads, dim = cu[-1], 8, 64
    q, k, v = (
        torch.randn(1, h, n, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for h in (heads, kv_heads, kv_heads)
    )
    module = torch.nn.Module().eval()
    assert attention._varlen_call(q, dim**-0.5) is not None, "torch's varlen_attn is not used on this GPU"

    def run(varlen: bool) -> tuple[torch.Tensor, ...]:
        for t in (q, k, v):
            t.grad = None
        if varlen:
            out, _ = attention.packed_attention(
                module, q, k, v, None, scaling=dim**-0.5, **attention.row_kwargs(cu)
            )
        else:
            out = attention._per_sequence(q, k, v, cu, 0.0, dim**-0.5).transpose(1, 2)
        out.float().square().sum().backward()
        return out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()

    fast, loop = run(True), run(False)
    for name, a, b in zip(("out", "dq", "dk", "dv"), fast, loop, strict=True):
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() <= 2e-2 * scale, name
