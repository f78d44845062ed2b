"""Test-only torchrun entry: each tiny model family (tests/tiny_models.py), tied and untied, loaded
into megatron-core at one TP x PP x EP layout through rlcore's mapping and model builder; every rank
runs its stage's forward of the same token ids (stages hand the hidden states on, as megatron's
schedule does) and the last stage's first TP rank writes the largest |megatron - HF| logit.

python -m rlcore.runtime.torchrun --nproc-per-node 2 -m tests.integration.megatron_logits_worker \
    --tp 2 --pp 1 --ep 1 --cases llama_gqa,qwen3_gqa --out result.json
"""

from __future__ import annotations

import argparse
import json

import torch

from tests.megatron_cpu_shim import install


def stage_forward(model: torch.nn.Module, ids: torch.Tensor, hidden_shape: tuple[int, ...]) -> torch.Tensor | None:
    """This stage's output (the full-vocabulary logits [b, s, V] on the last stage, else None): the
    previous stage's hidden states received first, this stage's sent on."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if not ps.is_pipeline_first_stage():
        hidden = torch.empty(hidden_shape)
        dist.recv(hidden, ps.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(hidden)
    out = model(ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None)
    if not ps.is_pipeline_last_stage():
        dist.send(out.contiguous(), ps.get_pipeline_model_parallel_next_rank())
        return None
    return gather_from_tensor_model_parallel_region(out)  # vocab-parallel shards -> [b, s, V padded]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--pp", type=int, required=True)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--cases", required=True, help="comma-separated tests/tiny_models.py CASES")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    install()
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rlcore.backends.megatron.mapping import ModelDims, check_layout
    from rlcore.backends.megatron.model import build_gpt, load_hf_weights, transformer_config
    from rlcore.backends.megatron.setup import model_parallel
    from rlcore.runtime.trainer_world import exit_world, init_world
    from tests.tiny_models import tiny_hf_model

    torch.set_num_threads(1)
    init_world("cpu")
    model_parallel(args.tp, args.pp, 1, seed=0, ep=args.ep)
    errors = {}
    ids = torch.randint(0, 101, (2, 10), generator=torch.Generator().manual_seed(3))  # TP divides it (sequence parallel)
    for case in args.cases.split(","):
        for tied in (False, True):
            hf_model = tiny_hf_model(case, tied)
            dims = ModelDims.from_hf_config(hf_model.config)
            check_layout(dims, args.tp, args.pp, args.ep)
            config = transformer_config(
                dims, args.tp, args.pp, torch.float32, on_cpu=True, recompute=False, ep=args.ep
            )
            model = build_gpt(config, dims).eval()
            state = hf_model.state_dict()
            load_hf_weights(model, state, dims)
            with torch.no_grad():
                logits = stage_forward(model, ids, (ids.shape[1], ids.shape[0], dims.hidden))
                if logits is not None:
                    want = hf_model(ids).logits
                    errors[f"{case}{'-tied' if tied else ''}"] = float((logits[..., : dims.vocab] - want).abs().max())
    if ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(errors, f)
    dist.barrier()
    exit_world(0)


if __name__ == "__main__":
    main()
