"""One rank of a strategy parity run (see parity_reference.py for the batch and the loss):

    python -m torch.distributed.run --standalone --nproc-per-node N -m tests.integration.parity_worker \
        --model PATH --strategy NAME --steps S --total-steps T --out DIR \
        [--set dotted.key=value ...] [--save-at K] [--resume-from CKPT_DIR]

Rank 0 writes DIR/result.json ({"losses", "grad_norms", "lrs"} per step; "logprob_diffs": per
micro-batch, the largest |compute_logprobs - old_logprobs| before training), DIR/grads.pt (HF name ->
gradient of this run's first step, before clipping) and DIR/weights.pt (HF name -> final weight).
`--save-at K` writes a checkpoint to DIR/ckpt after step K and goes on; `--resume-from` loads one
before the first step. `--set` overrides TrainerConfig fields (e.g. megatron.tensor_model_parallel_size=2).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from tests.integration.parity_reference import (
    SEED,
    TEMPERATURE,
    algorithm_config,
    micro_batch_count,
    parity_loss,
    parity_sequences,
    rank_micro_batches,
    trainer_config,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF model folder")
    p.add_argument("--strategy", required=True, help="a name in rlcore.backends.STRATEGIES")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps this process takes")
    p.add_argument("--total-steps", type=int, required=True, help="length of the lr schedule")
    p.add_argument("--out", required=True, help="folder for result.json, grads.pt, weights.pt, ckpt/")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="TrainerConfig override")
    p.add_argument("--save-at", type=int, default=None, help="save a checkpoint after this step")
    p.add_argument("--resume-from", default=None, help="checkpoint folder to load before the first step")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    return p.parse_args(argv)


def collect(named: Iterator[tuple[str, torch.Tensor]], keep: bool) -> dict[str, torch.Tensor]:
    """Consume a collective iterator on every rank; only a rank with `keep` stores the tensors."""
    out = {}
    for name, tensor in named:
        if keep:
            out[name] = tensor.detach().float().cpu().clone()
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.strategy == "megatron" and not torch.cuda.is_available():
        from tests.megatron_cpu_shim import install

        install()

    from rlcore.runtime.trainer_world import exit_world, init_world

    init_world(args.device)  # on CUDA: this rank's GPU, gloo beside NCCL for the CPU count below
    run(args)
    exit_world(0)  # as a launch rank leaves (a plain return could abort after the results are written)


def run(args: argparse.Namespace) -> None:
    from rlcore.backends import STRATEGIES
    from rlcore.core.hf_export import export_hf

    torch.set_num_threads(1)
    rank = dist.get_rank()
    trainer_cfg = trainer_config(args.set)
    strategy = STRATEGIES.resolve(args.strategy)(
        args.model, trainer_cfg, algorithm_config().optimizer, device=args.device,
        dtype=args.dtype, total_steps=args.total_steps, with_reference=False, seed=SEED,
    )  # fmt: skip
    max_tokens = trainer_cfg.max_token_len_per_gpu

    seqs = parity_sequences(args.model)
    loss_fn = parity_loss(seqs)
    count = torch.tensor([micro_batch_count(seqs, strategy.dp_rank, strategy.dp_size, max_tokens)])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    mbs = rank_micro_batches(seqs, strategy.dp_rank, strategy.dp_size, max_tokens, int(count))

    result: dict[str, list[float]] = {"losses": [], "grad_norms": [], "lrs": [], "logprob_diffs": []}
    if args.resume_from:
        strategy.load_checkpoint(args.resume_from)
    else:  # the untrained policy must score the batch as the HF model did when it built old_logprobs
        for mb, lp in zip(mbs, strategy.compute_logprobs(mbs, TEMPERATURE), strict=True):
            result["logprob_diffs"].append(
                float(((lp.float().cpu() - mb["old_logprobs"]).abs() * mb["loss_mask"]).max())
            )
    grads: dict[str, torch.Tensor] = {}
    for step in range(1, args.steps + 1):
        metrics = strategy.forward_backward(mbs, loss_fn, TEMPERATURE)
        if step == 1:
            grads = collect(strategy.iter_full_grads(), keep=rank == 0)
        result["grad_norms"].append(strategy.optimizer_step())
        result["losses"].append(metrics["actor/loss"])
        result["lrs"].append(strategy.current_lr())
        if step == args.save_at:
            strategy.save_checkpoint(os.path.join(args.out, "ckpt"))

    specs = strategy.weight_specs()
    names = []
    weights = {}
    for (name, tensor), (spec_name, dtype, shape) in zip(strategy.iter_full_weights(), specs, strict=True):
        assert (name, tensor.dtype, tuple(tensor.shape)) == (spec_name, dtype, shape), (
            f"rank {rank}: iter_full_weights gave {name} {tensor.dtype} {tuple(tensor.shape)}, "
            f"weight_specs announced {spec_name} {dtype} {shape}"
        )
        names.append(name)
        if rank == 0:
            weights[name] = tensor.detach().float().cpu().clone()
    assert list(grads) == [n for n in names if n in grads], "iter_full_grads is not in weight order"
    # the HF export every strategy feeds from the same iterator (collective; rank 0 writes)
    export_hf(
        strategy.iter_full_weights(),
        os.path.join(args.out, "hf"),
        strategy.hf_config(),
        args.model,
        rank == 0,
    )

    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(result, f)
        torch.save(grads, os.path.join(args.out, "grads.pt"))
        torch.save(weights, os.path.join(args.out, "weights.pt"))
    dist.barrier()


if __name__ == "__main__":
    main()
