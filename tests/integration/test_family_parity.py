"""The models users bring, trained like a plain HF model in one process: a tiny random Qwen3 (query
and key norms) on megatron with tensor parallelism, and a tiny random Qwen3-MoE (4 experts, top 2)
on fsdp2 over two ranks (transformers' own MoE blocks) and on megatron with its experts split over
two expert-parallel ranks; all with packed rows. The same
20-step run and checks as test_strategy_parity.py's cases (first-step loss, log-probs and
gradients by HF name, the loss curve, an exact resume from the step-10 checkpoint)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from .parity_checks import Run, assert_curve, assert_first_step, assert_resumed, run_worker, worst_relative
from .parity_reference import reference_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 20
SAVE_AT = 10

CASES: list[tuple[str, str, str, int, list[str]]] = [
    # (id, scratch architecture, strategy, ranks, TrainerConfig overrides)
    ("qwen3-megatron-tp2", "qwen3", "megatron", 2,
     ["megatron.tensor_model_parallel_size=2", "gradient_checkpointing=true"]),
    ("qwen3_moe-fsdp2-2", "qwen3_moe", "fsdp2", 2, []),
    # the experts split over 2 expert-parallel ranks (tokens reach them by all-to-all), the rest
    # data-parallel over the same 2 ranks
    ("qwen3_moe-megatron-ep2", "qwen3_moe", "megatron", 2, ["megatron.expert_model_parallel_size=2"]),
    # tensor parallelism beside expert parallelism: megatron-core's MoE layers then need sequence
    # parallelism (each TP rank's norms and routers see a slice of the tokens); 4 ranks: TP2 x DP2,
    # the experts over 2 EP ranks
    ("qwen3_moe-megatron-tp2-ep2", "qwen3_moe", "megatron", 4,
     ["megatron.tensor_model_parallel_size=2", "megatron.expert_model_parallel_size=2"]),
    # routing replay: the batch's rows carry random expert records (as an engine's), forced on
    # megatron-core's routers (EP2, recompute) against the HF model forced the same way (fsdp and
    # fsdp2 replay through transformers' own routers: tests/unit/backends/test_routing_replay.py)
    ("qwen3_moe-megatron-ep2-r3", "qwen3_moe", "megatron", 2,
     ["megatron.expert_model_parallel_size=2", "gradient_checkpointing=true"]),
    # ... and on one megatron rank with padded rows (they reach the router sequence-major)
    ("qwen3_moe-megatron-padded-r3", "qwen3_moe", "megatron", 1,
     ["use_remove_padding=false", "gradient_checkpointing=true"]),
]  # fmt: skip
CASE_BY_ID = {case[0]: case for case in CASES}


@pytest.fixture(scope="module")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """architecture -> its scratch model folder (random init, seed 0, char tokenizer), built once."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    built: dict[str, str] = {}

    def get(architecture: str) -> str:
        if architecture not in built:
            path = str(tmp_path_factory.mktemp("models") / architecture)
            spec = ScratchModelConfig(enabled=True, architecture=architecture)
            build_scratch_model(path, spec, max_model_len=256, seed=0)
            built[architecture] = path
        return built[architecture]

    return get


@pytest.fixture(scope="module")
def family_reference(family_model: Callable[[str], str]) -> Callable[..., tuple]:
    """(architecture, routed) -> the plain HF model's 20-step run on that family's model, made once
    (its first step is every layout's first-step reference: the same batch, weights and schedule)."""
    done: dict[tuple[str, bool], tuple] = {}

    def get(architecture: str, routed: bool = False) -> tuple:
        if (architecture, routed) not in done:
            torch.set_num_threads(1)
            done[architecture, routed] = reference_run(family_model(architecture), STEPS, STEPS, routed=routed)
        return done[architecture, routed]

    return get


@pytest.fixture(scope="module")
def family_run(family_model: Callable[[str], str], family_reference, tmp_path_factory: pytest.TempPathFactory):
    """case id -> (its 20-step run, the HF reference on the same model), each made once."""
    done: dict[str, tuple[Run, tuple]] = {}

    def get(case_id: str) -> tuple[Run, tuple]:
        if case_id not in done:
            _, architecture, strategy, ranks, sets = CASE_BY_ID[case_id]
            routed = case_id.endswith("-r3")
            run = run_worker(
                family_model(architecture), strategy, ranks, sets, str(tmp_path_factory.mktemp(case_id)),
                "--steps", str(STEPS), "--total-steps", str(STEPS), "--save-at", str(SAVE_AT),
                *(["--routed"] if routed else []),
            )  # fmt: skip
            done[case_id] = run, family_reference(architecture, routed)
        return done[case_id]

    return get


@pytest.mark.parametrize("case_id", list(CASE_BY_ID))
def test_a_model_family_trains_like_plain_hf_and_resumes_exactly(case_id, family_run, family_model, tmp_path):
    from transformers import AutoModelForCausalLM

    run, reference = family_run(case_id)
    assert_first_step(run, reference)
    assert_curve(run.result, reference[0], STEPS)
    if case_id.endswith("-r3"):  # the records are the batch's, not the model's: export and resume as above
        # records of transformers' own routing (the HF engine's): the strategy's routers agree on all
        differing, recorded = run.result["own_routing_counts"]
        assert recorded > 0 and differing == 0, run.result["own_routing_counts"]
        return
    exported = AutoModelForCausalLM.from_pretrained(
        os.path.join(run.out, "hf"), dtype=torch.float32
    ).state_dict()
    for name, w in run.weights.items():
        assert torch.equal(exported[name], w), name
    _, architecture, strategy, ranks, sets = CASE_BY_ID[case_id]
    resumed = run_worker(
        family_model(architecture), strategy, ranks, sets, str(tmp_path),
        "--steps", str(STEPS - SAVE_AT), "--total-steps", str(STEPS), "--resume-from", os.path.join(run.out, "ckpt"),
    )  # fmt: skip
    assert_resumed(resumed, run, SAVE_AT)


# (id, architecture, ranks, TrainerConfig overrides): every family at every layout the conversion covers
# that the 20-step cases above do not, first step only (llama's run in test_strategy_parity.py)
FIRST_STEP_LAYOUTS: list[tuple[str, str, int, list[str]]] = [
    ("qwen2-tp1", "qwen2", 1, []),
    ("qwen2-tp2", "qwen2", 2, ["megatron.tensor_model_parallel_size=2"]),
    ("qwen2-pp2", "qwen2", 2, ["megatron.pipeline_model_parallel_size=2"]),
    ("qwen3-tp1", "qwen3", 1, []),
    ("qwen3-pp2", "qwen3", 2, ["megatron.pipeline_model_parallel_size=2"]),
    ("qwen3_moe-tp1", "qwen3_moe", 1, []),
    ("qwen3_moe-pp2", "qwen3_moe", 2, ["megatron.pipeline_model_parallel_size=2"]),
    ("qwen3_moe-tp2", "qwen3_moe", 2, ["megatron.tensor_model_parallel_size=2"]),
    # routing replay at TP2 (sequence parallelism: each rank's routers replay their share of the
    # batch's records, as in the 20-step -r3 cases above), packed and padded, with recompute
    ("qwen3_moe-tp2-r3", "qwen3_moe", 2, ["megatron.tensor_model_parallel_size=2", "gradient_checkpointing=true"]),
    ("qwen3_moe-tp2-padded-r3", "qwen3_moe", 2,
     ["megatron.tensor_model_parallel_size=2", "use_remove_padding=false", "gradient_checkpointing=true"]),
    # context parallelism (each rank 2 of every sequence's 4 chunks), plain and replaying its chunks' records
    ("qwen3_moe-cp2", "qwen3_moe", 2, ["megatron.context_parallel_size=2", "gradient_checkpointing=true"]),
    ("qwen3_moe-cp2-r3", "qwen3_moe", 2, ["megatron.context_parallel_size=2", "gradient_checkpointing=true"]),
]  # fmt: skip


@pytest.mark.parametrize("layout", FIRST_STEP_LAYOUTS, ids=[c[0] for c in FIRST_STEP_LAYOUTS])
def test_first_step_gradients_by_hf_name_at_every_layout(layout, family_model, family_reference, tmp_path):
    """megatron's first step of each family at TP1, TP2 and PP2, Qwen3-MoE at CP2 (-r3: the batch's routing records
    replayed): the loss and log-probs within 1e-5 of a plain HF model's (its routers forced the same
    way) and every gradient, gathered to its HF name, within 1e-4."""
    case_id, architecture, ranks, sets = layout
    routed = case_id.endswith("-r3")
    run = run_worker(
        family_model(architecture), "megatron", ranks, sets, str(tmp_path), "--steps", "1", "--total-steps",
        str(STEPS), *(["--routed"] if routed else []),
    )  # fmt: skip
    assert_first_step(run, family_reference(architecture, routed))
    if routed:  # records of transformers' own routing: each rank's routers agree on its share
        differing, recorded = run.result["own_routing_counts"]
        assert recorded > 0 and differing == 0, run.result["own_routing_counts"]


FROZEN_STEPS = 6


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2", "megatron"])
def test_a_frozen_router_stays_as_loaded_and_the_rest_trains_like_plain_hf(strategy, family_model, tmp_path):
    """trainer.freeze_router on a Qwen3-MoE: the routers take no gradient and keep their loaded weights
    through 6 steps; everything else trains as a plain HF model with its routers frozen does."""
    from rlcore.backends.common.hf_model import HF_ROUTER_SUFFIX

    model = family_model("qwen3_moe")
    run = run_worker(
        model, strategy, 1, ["freeze_router=true"], str(tmp_path),
        "--steps", str(FROZEN_STEPS), "--total-steps", str(FROZEN_STEPS),
    )  # fmt: skip
    reference = reference_run(model, FROZEN_STEPS, FROZEN_STEPS, frozen=HF_ROUTER_SUFFIX)
    assert_first_step(run, reference)
    for step, (a, b) in enumerate(zip(run.result["losses"], reference[0], strict=True)):
        assert abs(a - b) <= 1e-4, f"step {step + 1}: loss {a} vs {b}"
    loaded = reference_run(model, 0, FROZEN_STEPS)[2]  # the weights as loaded
    routers = [n for n in run.weights if n.endswith(HF_ROUTER_SUFFIX)]
    assert len(routers) == 4  # one per layer of the tiny model
    for name in routers:
        assert torch.equal(run.weights[name], loaded[name]), f"{name} was trained"
        assert not run.grads[name].any(), name
    trained = [n for n in run.weights if n not in routers and not torch.equal(run.weights[n], loaded[n])]
    assert len(trained) == len(run.weights) - len(routers)  # every other weight moved
    # Adam normalises each step's update, so float32 rounding in the gradients shows in the weights
    # at about 1e-4 of their magnitude after 6 steps (fsdp: 1.1e-4); the losses above agree to 1e-4
    worst, rel = worst_relative(run.weights, reference[2])
    assert rel <= 1e-3, f"{worst} differs from the frozen-router reference by {rel:.3g}"
