"""GPU tier of the vLLM engine and its weight sync: vLLM on CUDA (bf16) against the HF engine, GRPO
with a vLLM rollout worker synced over NCCL (two GPUs) or from checkpoints on one shared GPU, and
mode colocate with sleep mode. Skipped without a CUDA device; needs the `vllm` CUDA build.

bf16 greedy decodes of a random-init model can part ways at near-ties, so the engine comparison
asks that every token vLLM picks is HF's argmax up to bf16 noise, instead of equal sequences.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from rlcore.core.types import SamplingParams
from tests.integration.launch_utils import launch, read_metrics, tiny_grpo_config
from tests.integration.vllm_support import require_vllm

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (GPU tier)", allow_module_level=True)
require_vllm()

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

BF16_TOLERANCE = 5e-2  # the probe's default for bf16 (synchronizer.probe_tolerance)
PROMPTS = ["3+4=", "12+9=", "7+7=", "40+2=", "9+16="]


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_path: str) -> Iterator:
    from rlcore.rollout.engines.vllm import VLLMEngine

    engine = VLLMEngine(
        tiny_model_path, device="cuda", dtype="bfloat16", max_model_len=256, max_batch_size=16,
        gpu_memory_utilization=0.3, enable_sleep_mode=True, enforce_eager=True,
    )  # fmt: skip
    yield engine
    engine.close()


def _prompts(model_path: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def _greedy(engine, prompts: list[list[int]]) -> list:
    return [c for (c,) in engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))]


def test_vllm_greedy_on_cuda_picks_hfs_argmax(vllm_engine, tiny_model_path: str) -> None:
    from rlcore.rollout.engines.hf import HFEngine

    hf = HFEngine(tiny_model_path, device="cuda", dtype="bfloat16", max_model_len=256, max_batch_size=16)
    prompts = _prompts(tiny_model_path)
    for ids, c in zip(prompts, _greedy(vllm_engine, prompts), strict=True):
        assert c.token_ids, "vLLM generated nothing"
        with torch.no_grad():
            logits = hf.model(torch.tensor([ids + c.token_ids], device="cuda")).logits.float()
        logprobs = torch.log_softmax(logits[0, len(ids) - 1 : -1], dim=-1)
        chosen = logprobs.gather(-1, torch.tensor(c.token_ids, device="cuda")[:, None])[:, 0]
        gap = (logprobs.max(-1).values - chosen).max().item()
        assert gap < BF16_TOLERANCE, f"prompt {ids}: vLLM picked a token {gap:.3f} below HF's argmax"
        diff = (chosen.cpu() - torch.tensor(c.logprobs)).abs().mean().item()
        assert diff < BF16_TOLERANCE, f"prompt {ids}: mean |log-prob difference| {diff:.3f}"


def test_sleep_frees_gpu_memory_and_wake_serves_the_same_tokens(vllm_engine, tiny_model_path: str) -> None:
    prompts = _prompts(tiny_model_path)
    before = [c.token_ids for c in _greedy(vllm_engine, prompts)]
    awake_free = torch.cuda.mem_get_info()[0]
    vllm_engine.sleep()
    slept_free = torch.cuda.mem_get_info()[0]
    # gpu_memory_utilization 0.3 reserves about 0.3 of the device, nearly all of it KV cache
    assert slept_free - awake_free > 0.1 * torch.cuda.mem_get_info()[1], (awake_free, slept_free)
    vllm_engine.wake_up(["weights"])
    vllm_engine.wake_up(["kv_cache"])
    assert [c.token_ids for c in _greedy(vllm_engine, prompts)] == before


def _grpo_with_vllm(root: str, **extra) -> list[dict]:
    cfg = tiny_grpo_config(
        root,
        **{
            "cluster.device": "cuda",
            "model.dtype": "bfloat16",
            "buffer.total_steps": 3,
            "explorer.rollout_model.engine_type": "vllm",
            "explorer.rollout_model.gpu_memory_utilization": 0.3,
            "explorer.rollout_model.enforce_eager": True,
            "synchronizer.probe": True,
            **extra,
        },
    )
    launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=800)
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "actor/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["sync/probe_logprob_diff"] < BF16_TOLERANCE for m in steps), [
        m["sync/probe_logprob_diff"] for m in steps
    ]
    return steps


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL sync needs a GPU each for trainer and engine")
def test_grpo_with_a_vllm_worker_synced_over_nccl_every_step(tmp_path) -> None:
    steps = _grpo_with_vllm(
        str(tmp_path), **{"synchronizer.sync_method": "nccl", "synchronizer.checksums": True}
    )
    assert all(m["perf/sync_gb_per_s"] > 0 for m in steps)


def test_grpo_with_a_vllm_worker_sharing_the_trainers_gpu_by_checkpoint_sync(tmp_path) -> None:
    _grpo_with_vllm(str(tmp_path), **{"synchronizer.sync_method": "checkpoint", "cluster.ranks_per_node": 1})


def test_colocated_vllm_sleeps_while_the_trainer_works(tmp_path) -> None:
    _grpo_with_vllm(str(tmp_path), **{"mode": "colocate", "explorer.rollout_model.enable_sleep_mode": True})


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="a vLLM engine in each of 2 trainer ranks needs 2 GPUs"
)
def test_colocated_vllm_in_every_rank_sleeps_and_each_engine_passes_the_probe(tmp_path) -> None:
    steps = _grpo_with_vllm(
        str(tmp_path),
        **{
            "mode": "colocate",
            "cluster.ranks_per_node": 2,
            "explorer.rollout_model.engine_num": 2,
            "explorer.rollout_model.enable_sleep_mode": True,
        },
    )
    assert all(m["rollout/engines"] == 2.0 and m["sync/probe_engines"] == 2.0 for m in steps), steps


def test_colocated_vllm_sleeps_through_an_sft_stage_and_serves_the_next_grpo_stage(tmp_path) -> None:
    """GRPO, SFT, GRPO on one GPU with sleep mode: the engine is built once, sleeps while the SFT
    stage trains, and the last stage pushes the SFT weights into it before its first rollout."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{
            "mode": "colocate",
            "cluster.device": "cuda",
            "model.dtype": "bfloat16",
            "explorer.rollout_model.engine_type": "vllm",
            "explorer.rollout_model.gpu_memory_utilization": 0.3,
            "explorer.rollout_model.enforce_eager": True,
            "explorer.rollout_model.enable_sleep_mode": True,
            "synchronizer.probe": True,
        },
    )
    sft = {
        "mode": "train",
        "algorithm": {"algorithm_type": "sft"},
        "buffer": {"batch_size": 8, "total_steps": 2},
    }
    cfg["stages"] = [
        {"name": "rl1", "buffer": {"total_steps": 2}},
        {"name": "sft", **sft},
        {"name": "rl2", "buffer": {"total_steps": 2}},
    ]
    proc = launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=800)
    assert "reusing the in-process vllm engine an earlier stage built" in proc.stdout + proc.stderr
    steps = [m for m in read_metrics(os.path.join(root, "it", "run", "stage2_rl2")) if "actor/loss" in m]
    assert len(steps) == 2
    assert all(m["sync/probe_logprob_diff"] < BF16_TOLERANCE for m in steps)
    assert all(m["rollout/logprob_diff_mean"] < BF16_TOLERANCE for m in steps), [
        m["rollout/logprob_diff_mean"] for m in steps
    ]
