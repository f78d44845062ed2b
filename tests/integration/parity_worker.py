"""One rank of a strategy parity run (see parity_reference.py for the batch and the loss):

    python -m torch.distributed.run --standalone --nproc-per-node N -m tests.integration.parity_worker \
        --model PATH --strategy NAME --steps S --total-steps T --out DIR \
        [--set dotted.key=value ...] [--save-at K] [--resume-from CKPT_DIR] [--critic]

Rank 0 writes DIR/result.json ({"losses", "grad_norms", "lrs"} per step; "logprob_diffs": per
micro-batch, the largest |compute_logprobs - old_logprobs| before training), DIR/grads.pt (HF name ->
gradient of this run's first step, before clipping) and DIR/weights.pt (HF name -> final weight).
`--lora ADAPTER` trains that peft adapter on the frozen model: the gradients are the adapter's (by
peft's saved names), the weights the merged ones, DIR/adapter its export; result.json adds
"reference_logprob_diffs" (the adapter switched off against the HF model's old_logprobs).
`--save-at K` writes a checkpoint to DIR/ckpt after step K and goes on; `--resume-from` loads one
before the first step. `--set` overrides TrainerConfig fields (e.g. megatron.tensor_model_parallel_size=2).
With `--set offload_untrained_models=true` the strategy also builds the (offloaded) reference, and
result.json adds "reference_logprob_diffs" before training and "trained_reference_logprob_diffs"
after it (the reference is the HF model throughout). `--critic` trains the strategy's value model on the value loss instead; `--dpo` trains DPO on the
batch's pairs through the trainer's own path (StageTraining), no checkpoint (parity_reference.py);
`--reward-model` trains a Bradley-Terry reward model on them the same way, and writes each
sequence's final score (result.json "scores") and its HF export (DIR/export).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from tests.integration.parity_reference import (
    LOSS_METRIC,
    NUM_SEQS,
    RM_MARGINS,
    SEED,
    TEMPERATURE,
    algorithm_config,
    dpo_algorithm_config,
    micro_batch_count,
    own_routing,
    parity_loss,
    parity_sequences,
    rank_micro_batches,
    reward_model_algorithm_config,
    trainer_config,
    with_value_targets,
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
    p.add_argument("--critic", action="store_true", help="train a value model on the value loss")
    p.add_argument("--dpo", action="store_true", help="train DPO on the batch's pairs (StageTraining)")
    p.add_argument("--reward-model", action="store_true", help="train a reward model on the pairs (StageTraining)")
    p.add_argument("--lora", default=None, help="train this peft adapter folder on the frozen model (LoRA)")
    p.add_argument("--routed", action="store_true", help="the batch carries routing records to replay (MoE)")
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
    if args.reward_model:
        run_reward_model(args)
    else:
        run_dpo(args) if args.dpo else run(args)
    exit_world(0)  # as a launch rank leaves (a plain return could abort after the results are written)


def run(args: argparse.Namespace) -> None:
    from rlcore.backends import STRATEGIES
    from rlcore.core.config.schema import LoraConfig
    from rlcore.core.hf_export import export_adapter, export_hf

    torch.set_num_threads(1)
    rank = dist.get_rank()
    trainer_cfg = trainer_config(args.set)
    lora = LoraConfig(path=args.lora) if args.lora else None
    strategy = STRATEGIES.resolve(args.strategy)(
        args.model, trainer_cfg, algorithm_config().optimizer, device=args.device,
        dtype=args.dtype, total_steps=args.total_steps, with_reference=trainer_cfg.offload_untrained_models,
        seed=SEED, value_head=args.critic,
        lora=lora,
    )  # fmt: skip
    strategy.replays_routing = args.routed  # as runtime/training.py sets it on the policy
    max_tokens = trainer_cfg.max_token_len_per_gpu * strategy.sequence_split  # as runtime/training.py budgets

    seqs = parity_sequences(args.model, args.routed)
    loss_fn = parity_loss(seqs, args.critic)
    layout = (strategy.dp_rank, strategy.dp_size, max_tokens)
    plan = {"balance": trainer_cfg.balance_batch, "packed": strategy.packs_sequences}
    count = torch.tensor([micro_batch_count(seqs, *layout, **plan)])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    mbs = rank_micro_batches(seqs, *layout, int(count), **plan)

    result: dict[str, list[float]] = {"losses": [], "grad_norms": [], "lrs": [], "logprob_diffs": []}
    has_reference = lora is not None or trainer_cfg.offload_untrained_models
    if has_reference:  # the HF model's old_logprobs (LoRA's reference: the model with the adapter off)
        result["reference_logprob_diffs"] = reference_diffs(strategy, mbs)
    if args.critic:  # the untrained critic's values (a resumed run still needs the same ones)
        with_value_targets(mbs, strategy.compute_values(mbs))
    if args.resume_from:
        strategy.load_checkpoint(args.resume_from)
    elif not args.critic and lora is None:
        # the untrained policy must score the batch as the HF model did when it built old_logprobs
        for mb, lp in zip(mbs, strategy.compute_logprobs(mbs, TEMPERATURE), strict=True):
            result["logprob_diffs"].append(
                float(((lp.float().cpu() - mb["old_logprobs"]).abs() * mb["loss_mask"]).max())
            )
    if args.routed and not args.resume_from:  # replaying transformers' own routing changes no route
        own = rank_micro_batches(own_routing(args.model, seqs), *layout, int(count), **plan)
        strategy.take_routing_counts()
        strategy.compute_logprobs(own, TEMPERATURE)
        counts = torch.tensor(strategy.take_routing_counts(), dtype=torch.float64)
        dist.all_reduce(counts)
        result["own_routing_counts"] = counts.tolist()  # [differing, recorded] token routes
    grads: dict[str, torch.Tensor] = {}
    for step in range(1, args.steps + 1):
        metrics = strategy.forward_backward(mbs, loss_fn, TEMPERATURE)
        if step == 1:
            grads = collect(strategy.iter_full_grads(), keep=rank == 0)
        result["grad_norms"].append(strategy.optimizer_step())
        result["losses"].append(metrics[LOSS_METRIC[args.critic]])
        result["lrs"].append(strategy.current_lr())
        if step == args.save_at:
            strategy.save_checkpoint(os.path.join(args.out, "ckpt"))
            # and leaves no process behind (megatron-core's writer would start a spawned Manager)
            assert not multiprocessing.active_children(), f"rank {rank}: {multiprocessing.active_children()}"
    if has_reference and lora is None:  # training moved the policy, never the reference
        result["trained_reference_logprob_diffs"] = reference_diffs(strategy, mbs)

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
    if lora is None:
        assert list(grads) == [n for n in names if n in grads], "iter_full_grads is not in weight order"
    else:  # the adapter in peft's format, next to the merged HF export
        result["adapter_sync_gap"] = [adapter_sync_gap(strategy, weights, rank == 0)]
        config = strategy.adapter_config()
        assert config is not None
        export_adapter(strategy.iter_adapter_weights(), os.path.join(args.out, "adapter"), config, rank == 0)
    # the HF export every strategy feeds from the same iterator (collective; rank 0 writes)
    export_hf(
        strategy.iter_full_weights(),
        os.path.join(args.out, "hf"),
        strategy.hf_config(),
        args.model,
        rank == 0,
    )

    write_results(args.out, result, grads, weights)


def adapter_sync_gap(strategy, merged: dict[str, torch.Tensor], keep: bool) -> float:
    """Adapter-only sync (weights/adapter.py): its entries, with the bases and then without, match
    the specs announced for them, and merged as an engine merges them give the merged weights (rank 0
    holds them in `merged`): the largest difference."""
    from rlcore.weights.adapter import merge_adapters

    bases: dict[str, torch.Tensor] = {}
    gap = 0.0
    for with_base in (True, False):
        specs = strategy.adapter_sync_specs(with_base)
        entries = list(strategy.iter_adapter_sync(with_base))
        assert [(n, t.dtype, tuple(t.shape)) for n, t in entries] == specs, (with_base, entries[:3], specs[:3])
        names = []
        for name, tensor in merge_adapters(entries, bases):
            names.append(name)
            if keep:
                gap = max(gap, float((tensor.float().cpu() - merged[name]).abs().max()))
        if keep:
            assert (names == list(merged)) if with_base else (set(names) < set(merged)), (with_base, names[:5])
    return gap


def reference_diffs(strategy, mbs: list[dict[str, torch.Tensor]]) -> list[float]:
    """Per micro-batch, the largest |reference log-prob - old_logprobs| over the loss mask."""
    ref = strategy.compute_logprobs(mbs, TEMPERATURE, reference=True)
    return [
        float(((lp.float().cpu() - mb["old_logprobs"]).abs() * mb["loss_mask"]).max())
        for mb, lp in zip(mbs, ref, strict=True)
    ]


def write_results(
    out: str, result: dict, grads: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]
) -> None:
    """Rank 0 writes result.json, grads.pt and weights.pt into `out` (collective: all ranks wait)."""
    if dist.get_rank() == 0:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
        torch.save(grads, os.path.join(out, "grads.pt"))
        torch.save(weights, os.path.join(out, "weights.pt"))
    dist.barrier()


def run_dpo(args: argparse.Namespace) -> None:
    """DPO through StageTraining.train_sequences(loss="dpo") on the parity batch's pairs."""
    from rlcore.runtime.training import sequence_spec

    training = stage_training(args, dpo_algorithm_config())
    specs = [
        sequence_spec(s.prompt_ids, s.response_ids, [], [0.0], None) for s in parity_sequences(args.model)
    ]
    result, grads = train_pairs(training, specs, "dpo", args.steps)
    write_results(args.out, result, grads, collect(training.strategy.iter_full_weights(), keep=dist.get_rank() == 0))


def stage_training(args: argparse.Namespace, algorithm: Any) -> Any:
    """The trainer's own StageTraining of the parity run's model and strategy, for `algorithm`."""
    from rlcore.core.config.schema import RLCoreConfig
    from rlcore.runtime.training import StageTraining

    torch.set_num_threads(1)
    cfg = RLCoreConfig(seed=SEED, algorithm=algorithm, trainer=trainer_config(args.set))
    cfg.trainer.strategy = args.strategy
    cfg.model.model_path, cfg.model.dtype = args.model, args.dtype
    return StageTraining(cfg, os.path.join(args.out, "stage"), args.model, args.device, args.total_steps)


def train_pairs(training: Any, specs: list[Any], loss: str, steps: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """`steps` optimizer steps of `loss` on `specs`: (result.json's per-step lists, with each step's
    metrics under "metrics"; the first step's gradients on rank 0)."""
    result: dict[str, list] = {"losses": [], "grad_norms": [], "lrs": [], "metrics": []}
    grads: dict[str, torch.Tensor] = {}
    for step in range(1, steps + 1):
        out = training.train_sequences(specs, loss, 1.0, 0.0)
        if step == 1:
            grads = collect(training.strategy.iter_full_grads(), keep=dist.get_rank() == 0)
        grad_norm, lr = training.optimizer_step()
        result["losses"].append(out["loss"])
        result["metrics"].append(out["metrics"])
        result["grad_norms"].append(grad_norm)
        result["lrs"].append(lr)
    return result, grads


def run_reward_model(args: argparse.Namespace) -> None:
    """A Bradley-Terry reward model through StageTraining.train_sequences(loss="bradley_terry") on the
    parity batch's pairs (RM_MARGINS, RM_CENTER); then each sequence's score and an HF export
    (DIR/export, result.json's "scores")."""
    from rlcore.core.hf_export import HF_DIR
    from rlcore.runtime.training import sequence_spec

    training = stage_training(args, reward_model_algorithm_config())
    margins = [RM_MARGINS[i // 2] if i % 2 == 0 else 0.0 for i in range(NUM_SEQS)]
    specs = [
        sequence_spec(s.prompt_ids, s.response_ids, [], [m], None)
        for s, m in zip(parity_sequences(args.model), margins, strict=True)
    ]
    result, grads = train_pairs(training, specs, "bradley_terry", args.steps)
    result["accuracies"] = [m["reward_model/accuracy"] for m in result["metrics"]]
    rank = dist.get_rank()
    result["scores"] = [v for (v,) in training.logprobs(specs, 1.0, reference=False)]
    checkpoint = training.save(export=True, explore_step=0)
    if rank == 0:
        os.replace(os.path.join(checkpoint, HF_DIR), os.path.join(args.out, "export"))
    write_results(args.out, result, grads, collect(training.strategy.iter_full_weights(), keep=rank == 0))


if __name__ == "__main__":
    main()
