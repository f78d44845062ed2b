"""A two-stage run (SFT warm-up, then GRPO with evaluation) through `rlcore launch`, end to end."""

import json
import os
import subprocess
import sys

import pytest
import torch

from .launch_utils import REPO, heldout_taskset, launch, read_metrics, tiny_grpo_config

pytestmark = pytest.mark.integration


def staged_config(root: str) -> dict:
    cfg = tiny_grpo_config(root)
    sampled = {**heldout_taskset(root, num_tasks=12), "name": "sampled", "repeat_times": 4,
               "rollout_args": {"temperature": 1.0, "max_tokens": 8}}  # fmt: skip
    cfg["buffer"]["explorer_input"]["eval_tasksets"] = [heldout_taskset(root, num_tasks=12), sampled]
    cfg["stages"] = [
        {
            "name": "warmup",
            "mode": "train",
            "algorithm": {"algorithm_type": "sft"},
            "buffer": {"batch_size": 8, "total_steps": 6},
        },
        {"name": "rl", "mode": "both", "buffer": {"total_steps": 2}, "explorer": {"eval_on_startup": True}},
    ]
    return cfg


def test_sft_then_grpo_chains_weights_evaluates_and_exports(tmp_path):
    root = str(tmp_path)
    proc = launch(staged_config(root), os.path.join(root, "cfg.yaml"))
    run_dir = os.path.join(root, "it", "run")
    assert "after stage 0 warmup (step 6): heldout/accuracy" in proc.stdout
    assert "after stage 1 rl (step 2): heldout/accuracy" in proc.stdout

    sft_summary = json.load(open(os.path.join(run_dir, "stage0_warmup", "stage_summary.json")))
    rl_metrics = read_metrics(os.path.join(run_dir, "stage1_rl"))
    # GRPO started from the SFT export: its startup evaluation equals SFT's final evaluation.
    assert rl_metrics[0]["step"] == 0
    assert rl_metrics[0]["eval/heldout/accuracy"] == sft_summary["eval"]["eval/heldout/accuracy"]
    assert (
        rl_metrics[0]["eval/heldout/response_len_mean"]
        == sft_summary["eval"]["eval/heldout/response_len_mean"]
    )

    # 4 samples per task: avg@4 (the accuracy over every sample, = the unbiased pass@1), pass@2, pass@4, maj@4
    for m in (m for m in rl_metrics if "eval/sampled/accuracy" in m):
        keys = {"avg@4", "pass@1", "pass@2", "pass@4", "maj@4"}
        assert keys <= {k.rsplit("/", 1)[1] for k in m if k.startswith("eval/sampled/")}, m
        assert m["eval/sampled/avg@4"] == pytest.approx(m["eval/sampled/accuracy"])
        assert m["eval/sampled/pass@1"] == pytest.approx(m["eval/sampled/avg@4"])
        assert m["eval/sampled/pass@1"] <= m["eval/sampled/pass@2"] <= m["eval/sampled/pass@4"] <= 1.0
    assert not any(k.startswith("eval/heldout/pass@") for m in rl_metrics for k in m)  # one sample: none

    # the final HF export loads with plain transformers and holds the trained (not initial) weights
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "stage1_rl", "global_step_2", "hf"))
    initial = AutoModelForCausalLM.from_pretrained(os.path.join(root, "model"))
    w_final = final.model.embed_tokens.weight
    assert not torch.equal(w_final, initial.model.embed_tokens.weight)
    assert final.config.use_cache


def test_existing_run_is_not_overwritten_and_runtime_errors_are_one_line(tmp_path):
    root = str(tmp_path)
    cfg = tiny_grpo_config(root, **{"buffer.total_steps": 1})
    path = os.path.join(root, "cfg.yaml")
    launch(cfg, path)
    again = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "launch", path], cwd=REPO, capture_output=True, text=True
    )
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "continue_from_checkpoint=true" in again.stderr

    bad = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "launch", path, "name=other",
         "buffer.explorer_input.taskset.reward_fn=[tests.integration.rewards:no_such_fn]"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "has no attribute 'no_such_fn'" in bad.stderr and "Traceback" not in bad.stderr


def test_an_sft_run_without_an_engine_resumes_with_the_probe_on(tmp_path):
    """An SFT stage with no evaluation runs no engine, so a resume has no weights to push and
    nothing to probe; it used to sync anyway, and rank 0 died on the probe's missing engine."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root, **{"mode": "train", "algorithm.algorithm_type": "sft", "buffer.batch_size": 8,
                 "buffer.total_steps": 2, "synchronizer.probe": True},
    )  # fmt: skip
    path = os.path.join(root, "cfg.yaml")
    launch(cfg, path)
    launch(cfg, path, "buffer.total_steps=3", "continue_from_checkpoint=true")
    steps = [m["step"] for m in read_metrics(os.path.join(root, "it", "run")) if "sft/loss" in m]
    assert steps == [1, 2, 3], steps
