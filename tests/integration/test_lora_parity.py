"""LoRA (model.lora_configs) on fsdp and fsdp2 (1 and 2 ranks) and megatron (2 tensor-parallel ranks, 2
pipeline stages) trains exactly like a plain peft model in one process (the parity harness of
test_strategy_parity.py, with --lora).

Every run starts from the same saved adapter whose B is not zero (a fresh adapter's B is 0, which
would leave A's first gradients 0 and the policy equal to the base): first-step loss within 1e-5,
every adapter gradient within 1e-4 of its largest magnitude, the loss at each step within 1e-3,
the reference (the adapter switched off) scoring the batch as the HF model did (1e-5), the merged
weights equal to peft's merge_and_unload, adapter-only sync merging on an engine into the same
weights. A resumed run equals the straight one (1e-6), and its checkpoint holds the adapter and its
optimizer only. megatron's LoRA follows fsdp2's for 20 steps.
"""

from __future__ import annotations

import os

import pytest
import torch

from .parity_checks import run_worker
from .parity_checks import worst_relative as _worst_relative
from .parity_reference import SEED, TEMPERATURE, parity_sequences, rank_micro_batches, reference_run

pytestmark = pytest.mark.integration

STEPS = 8
SAVE_AT = 4
CASES = {
    "fsdp-1": ("fsdp", 1, []),
    "fsdp-2": ("fsdp", 2, []),
    "fsdp2-1": ("fsdp2", 1, []),
    "fsdp2-2": ("fsdp2", 2, []),
    # megatron's adapters split over two tensor-parallel ranks (backends/megatron/lora.py's column-
    # and row-parallel factors; with activation recompute, whose layers see a frozen embedding's
    # output), and over two pipeline stages (the factors each stage holds)
    "megatron-tp2": ("megatron", 2, ["megatron.tensor_model_parallel_size=2", "gradient_checkpointing=true"]),
    "megatron-pp2": ("megatron", 2, ["megatron.pipeline_model_parallel_size=2"]),
}
RESUMED = ["fsdp-1", "fsdp2-2", "megatron-tp2"]


@pytest.fixture(scope="module")
def adapter(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A rank-4 adapter on every linear layer with random A and B, saved by peft."""
    from peft import LoraConfig, get_peft_model

    from rlcore.backends.common.hf_model import load_causal_lm

    torch.manual_seed(SEED)
    model = get_peft_model(
        load_causal_lm(tiny_model_path), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    path = str(tmp_path_factory.mktemp("adapter"))
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reference(tiny_model_path: str, adapter: str):
    torch.set_num_threads(1)
    return reference_run(tiny_model_path, STEPS, STEPS, lora=adapter)


@pytest.fixture(scope="module")
def runs(tiny_model_path: str, adapter: str, tmp_path_factory: pytest.TempPathFactory):
    done = {}

    def get(case: str):
        if case not in done:
            strategy, ranks, sets = CASES[case]
            done[case] = run_worker(
                tiny_model_path, strategy, ranks, sets, str(tmp_path_factory.mktemp(f"lora-{case}")), "--lora", adapter,
                "--steps", str(STEPS), "--total-steps", str(STEPS), "--save-at", str(SAVE_AT),
            )  # fmt: skip
        return done[case]

    return get


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", CASES)
def test_lora_trains_like_a_plain_peft_model(case, runs, reference, tiny_model_path, adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlcore.backends.common.hf_model import forward_logprobs

    run = runs(case)
    ref_losses, ref_grads, ref_weights = reference
    assert ref_losses[-1] < ref_losses[0] - 0.5, ref_losses  # the adapter really learns
    assert abs(run.result["losses"][0] - ref_losses[0]) <= 1e-5, (run.result["losses"][0], ref_losses[0])
    # the reference policy is the base model: the adapter switched off scores like the HF model
    assert max(run.result["reference_logprob_diffs"]) <= 1e-5, run.result["reference_logprob_diffs"]
    assert sorted(run.grads) == sorted(ref_grads) and all(".lora_" in n for n in run.grads)
    assert all(float(g.abs().max()) > 0 for g in ref_grads.values())  # A's and B's gradients move
    worst, rel = _worst_relative(run.grads, ref_grads)
    assert rel <= 1e-4, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    diffs = [abs(a - b) for a, b in zip(run.result["losses"], ref_losses, strict=True)]
    assert max(diffs) <= 1e-3, (run.result["losses"], ref_losses)
    # adapter-only sync (the bases, then the factors alone) merges on an engine into the same weights
    assert run.result["adapter_sync_gap"] == [0.0], run.result["adapter_sync_gap"]
    # merged per tensor as the engines get them, equal to peft's merge_and_unload, under HF names
    assert sorted(run.weights) == sorted(ref_weights)
    worst, rel = _worst_relative(run.weights, ref_weights)
    assert rel <= 1e-4, f"merged weight {worst} differs by {rel:.3g}"

    # the HF export is the merged model; the adapter export loads with peft and scores alike
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(run.out, "hf"), dtype=torch.float32)
    for name, w in run.weights.items():
        assert torch.equal(merged.state_dict()[name], w), name
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, os.path.join(run.out, "adapter"))
    (mb,) = rank_micro_batches(parity_sequences(tiny_model_path), 0, 1, 1 << 20, 1)
    with torch.no_grad():
        want, _ = forward_logprobs(merged, mb, TEMPERATURE, False)
        got, _ = forward_logprobs(loaded.eval(), mb, TEMPERATURE, False)
    gap = float(((got - want).abs() * mb["loss_mask"]).max())
    assert gap <= 1e-5, f"the exported adapter's log-probs differ from the trainer's merged model's by {gap}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", RESUMED)
def test_lora_resume_matches_the_straight_run_from_an_adapter_only_checkpoint(
    case, runs, tiny_model_path, adapter, tmp_path
):
    from torch.distributed.checkpoint import FileSystemReader

    strategy, ranks, sets = CASES[case]
    straight = runs(case)
    ckpt = os.path.join(straight.out, "ckpt")
    saved = FileSystemReader(ckpt).read_metadata().state_dict_metadata
    if strategy == "megatron":  # megatron's keys: a layer's parameter over every layer, no "model." prefix
        model_keys = [k for k in saved if not k.startswith("optimizer.")]
    else:
        model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all("lora" in k for k in model_keys), model_keys[:5]
    resumed = run_worker(
        tiny_model_path, strategy, ranks, sets, str(tmp_path), "--lora", adapter,
        "--steps", str(STEPS - SAVE_AT), "--total-steps", str(STEPS), "--resume-from", ckpt,
    )  # fmt: skip
    assert resumed.result["losses"] == pytest.approx(straight.result["losses"][SAVE_AT:], abs=1e-6)
    assert list(resumed.weights) == list(straight.weights)
    for name, w in resumed.weights.items():
        assert (w - straight.weights[name]).abs().max().item() <= 1e-6, name


@pytest.mark.timeout(900)
def test_megatron_lora_follows_fsdp2_lora_for_twenty_steps(tiny_model_path, adapter, tmp_path):
    """megatron's LoRA over two tensor-parallel ranks against fsdp2's over two data-parallel ranks,
    from the same adapter on the same batch for 20 steps: the first loss within 1e-5, every loss
    within 1e-3 (measured: 1e-7 and 3e-7)."""
    steps = ["--steps", "20", "--total-steps", "20"]
    losses = {
        case: run_worker(
            tiny_model_path, CASES[case][0], 2, CASES[case][2], str(tmp_path / case), "--lora", adapter, *steps
        ).result["losses"]
        for case in ("fsdp2-2", "megatron-tp2")
    }
    fsdp2, megatron = losses["fsdp2-2"], losses["megatron-tp2"]
    assert fsdp2[-1] < fsdp2[0] - 1.0, fsdp2  # the adapter learns over the 20 steps
    assert abs(megatron[0] - fsdp2[0]) <= 1e-5, (megatron[0], fsdp2[0])
    assert max(abs(a - b) for a, b in zip(megatron, fsdp2, strict=True)) <= 1e-3, (megatron, fsdp2)
