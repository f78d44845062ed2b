"""Every training strategy trains the tiny model exactly like a plain HF model in one process.

Each case runs tests/integration/parity_worker.py under torchrun once (20 steps, a checkpoint after
step 10) and is compared with `reference_run` (parity_reference.py): first-step loss within 1e-5,
every first-step gradient by HF name within 1e-4 of that gradient's largest magnitude, the
untrained policy's `compute_logprobs` within 1e-5 of the HF model's, the loss at
every one of the 20 steps within 1e-3. The reference pads every row and splits the batch
contiguously; the cases pack sequences and deal the batch by token counts (trainer.use_remove_padding,
trainer.balance_batch, on by default) unless their overrides say otherwise. Resume parity: 10 steps resumed from the step-10 checkpoint
give the same losses and final weights (1e-6) as the uninterrupted run's steps 11-20.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import pytest
import torch

from .parity_checks import Run, assert_curve, assert_first_step, assert_resumed, run_worker, worst_relative
from .parity_reference import (
    dpo_reference_run,
    parity_sequences,
    plain_reward_model,
    plain_scores,
    reference_run,
    reward_model_reference_run,
)

pytestmark = pytest.mark.integration

STEPS = 20
SAVE_AT = 10

CASES: list[tuple[str, str, int, list[str]]] = [
    # (id, strategy, ranks, TrainerConfig overrides for parity_worker --set)
    # (fsdp and fsdp2 pack sequences and every case deals the batch by token counts, by default;
    # this one pads and shares contiguously)
    ("fsdp-1-padded", "fsdp", 1, ["use_remove_padding=false", "balance_batch=false"]),
    ("fsdp-2", "fsdp", 2, []),
    ("fsdp2-2", "fsdp2", 2, []),
    # the policy's shards and the reference's on the CPU (FSDP2's CPUOffloadPolicy): the same numbers
    ("fsdp2-2-offload", "fsdp2", 2, ["fsdp_config.param_offload=true", "offload_untrained_models=true"]),
    # Ulysses: both ranks share one data-parallel share, each forward sliced over them, with
    # gradient checkpointing (each layer recomputed in backward, its all-to-alls with it); on fsdp2
    # and on fsdp (NativeStrategy's Ulysses, fsdp's own wrapping)
    ("fsdp2-sp2", "fsdp2", 2, ["ulysses_sequence_parallel_size=2", "gradient_checkpointing=true"]),
    ("fsdp-sp2", "fsdp", 2, ["ulysses_sequence_parallel_size=2", "gradient_checkpointing=true"]),
    # megatron-core on CPU through tests/megatron_cpu_shim.py (parity_worker installs it); one-rank
    # fsdp2 is what most launch tests run
    ("megatron-tp1-padded", "megatron", 1, ["use_remove_padding=false"]),
    # tensor parallel with activation recompute (megatron's RNG tracker across the recomputed forward)
    ("megatron-tp2", "megatron", 2, ["megatron.tensor_model_parallel_size=2", "gradient_checkpointing=true"]),
    ("megatron-pp2", "megatron", 2, ["megatron.pipeline_model_parallel_size=2"]),
    ("megatron-dp2", "megatron", 2, []),  # data parallel with the distributed optimizer
    # context parallel: both ranks share one data-parallel share, each holds 2 of every sequence's 4
    # chunks, with activation recompute (each layer's key/value all-gathers again in backward)
    ("megatron-cp2", "megatron", 2, ["megatron.context_parallel_size=2", "gradient_checkpointing=true"]),
]
RESUME_CASES = ["fsdp-2", "fsdp2-sp2", "fsdp2-2-offload", "megatron-tp2", "megatron-pp2", "megatron-dp2", "megatron-cp2"]
"""Ids of CASES whose step-10 checkpoint is resumed: FSDP's, Ulysses', offloaded FSDP2's and
megatron's four layouts. Plain fsdp2's resume is proven in whole launches, a resumed run ending on
the straight run's weights (test_algorithm_menu.py: with a reference, a critic and expert rows)."""

CASE_BY_ID = {case[0]: case for case in CASES}


@pytest.fixture(scope="module")
def reference(tiny_model_path: str) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    return reference_run(tiny_model_path, STEPS, STEPS)


@pytest.fixture(scope="module")
def case_run(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """case id -> its 20-step run (launched on first use, once per module)."""
    done: dict[str, Run] = {}

    def get(case_id: str) -> Run:
        if case_id not in done:
            _, strategy, ranks, sets = CASE_BY_ID[case_id]
            out = str(tmp_path_factory.mktemp(case_id))
            done[case_id] = run_worker(
                tiny_model_path, strategy, ranks, sets, out,
                "--steps", str(STEPS), "--total-steps", str(STEPS), "--save-at", str(SAVE_AT),
            )  # fmt: skip
        return done[case_id]

    return get


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_first_step_loss_and_gradients(case_id, case_run, reference):
    assert_first_step(case_run(case_id), reference)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_loss_curve(case_id, case_run, reference):
    assert_curve(case_run(case_id).result, reference[0], STEPS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("strategy", "ranks"), [("fsdp", 2), ("fsdp2", 2), ("megatron", 1)])
def test_float16_scales_its_loss_and_learns_like_float32(
    strategy, ranks, reference, tiny_model_path, tmp_path
):
    """float16 keeps a dynamic loss scale: each micro-batch's loss is multiplied by it and the
    gradients are divided by it before clipping, so the first step's gradients match float32's
    within float16's rounding. A step that overflows reports an inf norm, changes no weight and
    lowers the scale, so the loss curve is float32's with those steps left out (here FSDP overflows
    at steps 2 and 4 from 2**16, megatron at 3 and 4). megatron used to divide unscaled gradients
    by its scale (2**-32 too small: nothing learned), and megatron-core's own first scale, 2**32,
    overflowed and skipped every step."""
    steps = 4
    run = run_worker(
        tiny_model_path, strategy, ranks, [], str(tmp_path),
        "--steps", str(steps), "--total-steps", str(STEPS), "--dtype", "float16",
    )  # fmt: skip
    ref_losses, ref_grads, _ = reference
    worst, rel = worst_relative(run.grads, ref_grads)
    assert rel <= 2e-2, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    applied = 0  # the reference's steps this run has taken so far
    for loss, norm in zip(run.result["losses"], run.result["grad_norms"], strict=True):
        # the reference's loss falls by about 0.6 a step here: a wrong step count cannot pass
        assert abs(loss - ref_losses[applied]) <= 5e-2, (run.result, ref_losses[:steps])
        applied += math.isfinite(norm)
    assert applied >= steps // 2, run.result["grad_norms"]  # the scale came down and steps resumed


@pytest.mark.timeout(600)
def test_float16_resume_restores_the_loss_scale(tiny_model_path, tmp_path):
    """The loss scale is training state: a run resumed at step 4 takes the same steps as one that
    went straight on, skips included. Resumed at 2**16 instead of the 2**14 it had come down to,
    FSDP skipped two more steps here (seen)."""
    common = ("--total-steps", str(STEPS), "--dtype", "float16")
    straight = run_worker(
        tiny_model_path, "fsdp2", 2, [], str(tmp_path / "straight"), "--steps", "8", "--save-at", "4", *common
    )
    resumed = run_worker(
        tiny_model_path, "fsdp2", 2, [], str(tmp_path / "resumed"), "--steps", "4",
        "--resume-from", os.path.join(straight.out, "ckpt"), *common,
    )  # fmt: skip
    assert resumed.result["grad_norms"] == pytest.approx(straight.result["grad_norms"][4:], rel=1e-6)
    assert resumed.result["losses"] == pytest.approx(straight.result["losses"][4:], abs=1e-6)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_hf_export_loads_with_the_trained_weights(case_id, case_run):
    from transformers import AutoModelForCausalLM

    run = case_run(case_id)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(run.out, "hf"), dtype=torch.float32)
    exported = model.state_dict()
    for name, w in run.weights.items():
        assert torch.equal(exported[name], w), name


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", RESUME_CASES)
def test_resume_matches_uninterrupted_run(case_id, case_run, tiny_model_path, tmp_path):
    straight = case_run(case_id)
    _, strategy, ranks, sets = CASE_BY_ID[case_id]
    resumed = run_worker(
        tiny_model_path, strategy, ranks, sets, str(tmp_path),
        "--steps", str(STEPS - SAVE_AT), "--total-steps", str(STEPS),
        "--resume-from", os.path.join(straight.out, "ckpt"),
    )  # fmt: skip
    assert_resumed(resumed, straight, SAVE_AT)


@pytest.mark.timeout(900)
def test_tied_embeddings_across_pipeline_stages(tmp_path_factory):
    """A tied model split over two stages: the last stage's copy of the embedding is loaded from HF
    and kept in sync through megatron's embedding group (the gradient is the sum of both uses)."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    model = str(tmp_path_factory.mktemp("tied") / "model")
    build_scratch_model(
        model, ScratchModelConfig(enabled=True, tie_word_embeddings=True), max_model_len=256, seed=0
    )
    steps = 5
    ref_losses, ref_grads, ref_weights = reference_run(model, steps, steps)
    run = run_worker(
        model, "megatron", 2, ["megatron.pipeline_model_parallel_size=2"], str(tmp_path_factory.mktemp("tied-run")),
        "--steps", str(steps), "--total-steps", str(steps),
    )  # fmt: skip
    assert "lm_head.weight" not in run.weights  # tied: exported as the embedding only
    assert abs(run.result["losses"][0] - ref_losses[0]) <= 1e-5
    grads = {n: g for n, g in ref_grads.items() if n != "lm_head.weight"}  # HF lists the tied head too
    worst, rel = worst_relative(run.grads, grads)
    assert rel <= 1e-4, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    assert max(abs(a - b) for a, b in zip(run.result["losses"], ref_losses, strict=True)) <= 1e-3
    worst, rel = worst_relative(run.weights, {n: w for n, w in ref_weights.items() if n in run.weights})
    # Adam divides by sqrt(v): on near-zero gradients float rounding shows in the update
    assert rel <= 1e-3, f"final weight {worst} differs by {rel:.3g}"


CRITIC_CASES = ["fsdp-2", "fsdp2-2", "fsdp2-sp2", "megatron-tp2", "megatron-pp2", "megatron-dp2", "megatron-cp2"]
"""Ids of CASES whose strategy also trains PPO's critic (its value head across data-parallel ranks
with the distributed optimizer, tensor-parallel ranks, pipeline stages and context-parallel ranks;
the one-rank layouts are the policy's cases above)."""


@pytest.fixture(scope="module")
def critic_reference(
    tiny_model_path: str,
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    return reference_run(tiny_model_path, STEPS, STEPS, critic=True)


@pytest.fixture(scope="module")
def critic_run(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """case id -> its 20-step critic run (launched on first use, once per module)."""
    done: dict[str, Run] = {}

    def get(case_id: str) -> Run:
        if case_id not in done:
            _, strategy, ranks, sets = CASE_BY_ID[case_id]
            out = str(tmp_path_factory.mktemp(f"critic-{case_id}"))
            done[case_id] = run_worker(
                tiny_model_path, strategy, ranks, sets, out, "--critic",
                "--steps", str(STEPS), "--total-steps", str(STEPS), "--save-at", str(SAVE_AT),
            )  # fmt: skip
        return done[case_id]

    return get


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", CRITIC_CASES)
def test_critic_trains_like_a_plain_hf_value_model(case_id, critic_run, critic_reference):
    """PPO's critic: first-step value loss and gradients (value head included), the 20-step value
    loss curve (the clip engages as values move), and an HF export that loads as a value model."""
    from transformers import AutoModelForTokenClassification

    run = critic_run(case_id)
    ref_losses, ref_grads, _ = critic_reference
    assert ref_losses[-1] < ref_losses[0] - 0.3, ref_losses  # the critic really learns
    assert abs(run.result["losses"][0] - ref_losses[0]) <= 1e-5, (run.result["losses"][0], ref_losses[0])
    assert sorted(run.grads) == sorted(ref_grads) and "score.weight" in run.grads
    worst, rel = worst_relative(run.grads, ref_grads)
    assert rel <= 1e-4, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    diffs = [abs(a - b) for a, b in zip(run.result["losses"], ref_losses, strict=True)]
    step = max(range(STEPS), key=lambda i: diffs[i])
    assert diffs[step] <= 1e-3, (
        f"step {step + 1}: value loss {run.result['losses'][step]} vs {ref_losses[step]}"
    )
    exported = AutoModelForTokenClassification.from_pretrained(
        os.path.join(run.out, "hf"), dtype=torch.float32
    )
    state = exported.state_dict()
    for name, w in run.weights.items():
        assert torch.equal(state[name], w), name


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", ["megatron-tp2"])  # fsdp2's: test_algorithm_menu.py's PPO launch
def test_critic_resume_matches_uninterrupted_run(case_id, critic_run, tiny_model_path, tmp_path):
    _, strategy, ranks, sets = CASE_BY_ID[case_id]
    straight = critic_run(case_id)
    resumed = run_worker(
        tiny_model_path, strategy, ranks, sets, str(tmp_path), "--critic",
        "--steps", str(STEPS - SAVE_AT), "--total-steps", str(STEPS),
        "--resume-from", os.path.join(straight.out, "ckpt"),
    )  # fmt: skip
    assert resumed.result["losses"] == pytest.approx(straight.result["losses"][SAVE_AT:], abs=1e-6)
    for name, w in resumed.weights.items():
        assert (w - straight.weights[name]).abs().max().item() <= 1e-6, name


DPO_CASES = ["fsdp2-2", "megatron-tp2"]  # fsdp splits pairs as fsdp2 does (NativeStrategy's batches)
DPO_STEPS = 6


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", DPO_CASES)
def test_dpo_trains_like_the_textbook_loss(case_id, tiny_model_path, tmp_path):
    """DPO through the trainer's own path (pairs split over micro-batches and data-parallel ranks,
    policy and reference scored first, then the surrogate) against autograd on the pair loss in one
    process: first-step gradients, the loss over 6 steps, the final weights."""
    _, strategy, ranks, sets = CASE_BY_ID[case_id]
    run = run_worker(
        tiny_model_path, strategy, ranks, sets, str(tmp_path), "--dpo",
        "--steps", str(DPO_STEPS), "--total-steps", str(STEPS),
    )  # fmt: skip
    torch.set_num_threads(1)
    ref_losses, ref_grads, ref_weights = dpo_reference_run(tiny_model_path, DPO_STEPS, STEPS)
    assert abs(ref_losses[0] - math.log(2)) < 1e-6 and ref_losses[-1] < ref_losses[0] - 0.1, ref_losses
    worst, rel = worst_relative(run.grads, ref_grads)
    assert rel <= 1e-4, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    diffs = [abs(a - b) for a, b in zip(run.result["losses"], ref_losses, strict=True)]
    assert max(diffs) <= 1e-4, (run.result["losses"], ref_losses)
    worst, rel = worst_relative(run.weights, {n: w for n, w in ref_weights.items() if n in run.weights})
    assert rel <= 1e-3, f"final weight {worst} differs by {rel:.3g}"


REWARD_MODEL_CASES = ["fsdp2-2", "megatron-tp2"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case_id", REWARD_MODEL_CASES)
def test_reward_model_trains_like_transformers(case_id, tiny_model_path, tmp_path):
    """A Bradley-Terry reward model (algorithm_type reward_model, with margins and the centring term)
    through the trainer's own path, pairs split over micro-batches and ranks, against transformers'
    AutoModelForSequenceClassification and autograd on the same loss in one process: the first
    step's loss within 1e-5 and its gradients, the 20-step curve within 1e-3, the final weights;
    its HF export loads as AutoModelForSequenceClassification and scores as the trainer does."""
    from transformers import AutoModelForSequenceClassification

    _, strategy, ranks, sets = CASE_BY_ID[case_id]
    run = run_worker(
        tiny_model_path, strategy, ranks, sets, str(tmp_path), "--reward-model",
        "--steps", str(STEPS), "--total-steps", str(STEPS),
    )  # fmt: skip
    torch.set_num_threads(1)
    ref_losses, ref_grads, ref_weights = reward_model_reference_run(tiny_model_path, STEPS, STEPS)
    assert ref_losses[-1] < ref_losses[0] - 0.1, ref_losses  # it learns the pairs
    losses = run.result["losses"]
    assert abs(losses[0] - ref_losses[0]) <= 1e-5, (losses[0], ref_losses[0])
    diffs = [abs(a - b) for a, b in zip(losses, ref_losses, strict=True)]
    assert max(diffs) <= 1e-3, (losses, ref_losses)
    assert run.result["accuracies"][-1] == 1.0, run.result["accuracies"]
    worst, rel = worst_relative(run.grads, ref_grads)
    assert rel <= 1e-4, f"gradient of {worst} differs by {rel:.3g} of its largest magnitude"
    assert set(run.weights) == set(ref_weights), set(run.weights) ^ set(ref_weights)  # score.weight, no bias
    worst, rel = worst_relative(run.weights, ref_weights)
    assert rel <= 1e-3, f"final weight {worst} differs by {rel:.3g}"

    exported = AutoModelForSequenceClassification.from_pretrained(os.path.join(str(tmp_path), "export"))
    assert type(exported).__name__.endswith("ForSequenceClassification"), type(exported)
    with torch.no_grad():
        scores = plain_scores(exported, parity_sequences(tiny_model_path))
    assert scores.tolist() == pytest.approx(run.result["scores"], abs=1e-5)
    assert plain_reward_model(tiny_model_path).config.pad_token_id == exported.config.pad_token_id
