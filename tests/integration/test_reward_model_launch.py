"""A reward model's stage in real launches (algorithm_type reward_model, mode train): it trains on the
taskset's (chosen, rejected) pairs, evaluates its pair accuracy on held-out pairs, exports a folder
that transformers loads as AutoModelForSequenceClassification and that scores as the stage did,
and resumes from a checkpoint to the straight run's losses and weights."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from .launch_utils import heldout_taskset, launch, read_metrics, tiny_grpo_config

pytestmark = pytest.mark.integration


def _config(root: str, steps: int) -> dict:
    pairs = {"generator": "arithmetic", "path": os.path.join(root, "pairs.jsonl"),
             "generator_args": {"num_tasks": 64, "max_operand": 9, "preference_pairs": True}}  # fmt: skip
    heldout = heldout_taskset(root, 20)
    heldout["generator_args"]["preference_pairs"] = True
    return tiny_grpo_config(
        root, **{"mode": "train", "algorithm.algorithm_type": "reward_model", "algorithm.kl_loss_coef": 0.0,
                 "algorithm.reward_model.center_coef": 0.01, "buffer.total_steps": steps, "trainer.save_interval": 2,
                 "buffer.explorer_input.taskset": pairs, "buffer.explorer_input.eval_tasksets": [heldout],
                 "explorer.eval_interval": 2, "trainer.save_hf_checkpoint": "always"},
    )  # fmt: skip


def _steps(root: str) -> list[dict]:
    return [m for m in read_metrics(os.path.join(root, "it", "run")) if "reward_model/loss" in m]


def _scores(folder: str, rows: list[dict]) -> list[float]:
    """transformers' own scores of each row's chosen and rejected text (prompt + response tokens)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    out = []
    with torch.no_grad():
        for row in rows:
            for response in (row["chosen"], row["rejected"]):
                ids = tok(row["prompt"], add_special_tokens=False)["input_ids"]
                ids = ids + tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                out.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
    return out


def test_reward_model_stage_trains_evaluates_exports_and_resumes(tmp_path):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch(_config(straight, 4), straight + ".yaml")
    a = _steps(straight)
    assert [m["step"] for m in a] == [1, 2, 3, 4]
    # a fresh head scores near 0: the first pairs cost about log 2 (learning: test_strategy_parity.py)
    assert abs(a[0]["reward_model/loss"] - math.log(2)) < 0.1, a[0]
    evals = [m for m in read_metrics(os.path.join(straight, "it", "run")) if "eval/heldout/pair_accuracy" in m]
    assert [m["step"] for m in evals] == [2, 4] and all(m["eval/heldout/pairs"] == 20 for m in evals)

    # the export: transformers' sequence classifier, which scores the held-out pairs as the stage did
    export = os.path.join(straight, "it", "run", "global_step_4", "hf")
    with open(os.path.join(export, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForSequenceClassification"]
    with open(os.path.join(straight, "test.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    scores = _scores(export, rows)
    accuracy = sum(c > r for c, r in zip(scores[0::2], scores[1::2], strict=True)) / len(rows)
    margin = sum(c - r for c, r in zip(scores[0::2], scores[1::2], strict=True)) / len(rows)
    assert accuracy == evals[-1]["eval/heldout/pair_accuracy"]
    assert margin == pytest.approx(evals[-1]["eval/heldout/margin"], abs=1e-5)

    # through a checkpoint: the same losses at every step, the same final weights
    launch(_config(resumed, 2), resumed + ".yaml")
    launch(_config(resumed, 2), resumed + ".yaml", "buffer.total_steps=4", "continue_from_checkpoint=true")
    b = _steps(resumed)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert abs(x["reward_model/loss"] - y["reward_model/loss"]) < 1e-6, (x["step"], x, y)
    wa, wb = (load_file(os.path.join(r, "it", "run", "global_step_4", "hf", "model.safetensors")) for r in (straight, resumed))
    assert set(wa) == set(wb) and "score.weight" in wa and "score.bias" not in wa
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6


def test_sft_then_reward_model_then_rl_scored_by_it(tmp_path):
    """The preference recipe's shape in one run (configs/reward_model.yaml): the RL stage starts from
    the SFT stage's weights (not the reward model's) and its rollouts are scored by the reward model
    stage's export ('stage:reward_model'), on the rollout worker, as transformers scores them."""
    root = str(tmp_path / "chain")
    demos = {"generator": "arithmetic", "path": os.path.join(root, "demos.jsonl"),
             "generator_args": {"num_tasks": 64, "max_operand": 9}}  # fmt: skip
    pairs = {**demos, "path": os.path.join(root, "pairs.jsonl"),
             "generator_args": {"num_tasks": 64, "max_operand": 9, "preference_pairs": True}}  # fmt: skip
    scored = {"reward_fn": ["reward_model"], "reward_model": {"path": "stage:reward_model", "normalize": "sigmoid"}}
    logged = {"monitor_type": ["jsonl"], "log_completions": True, "save_completions_probability": 1.0}
    cfg = tiny_grpo_config(root, monitor=logged, **{"stages": [
        {"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"},
         "buffer": {"total_steps": 2, "explorer_input": {"taskset": demos}}},
        {"name": "reward_model", "mode": "train", "algorithm": {"algorithm_type": "reward_model"},
         "buffer": {"total_steps": 2, "explorer_input": {"taskset": pairs}}},
        {"name": "rl", "mode": "both", "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
         "buffer": {"total_steps": 2, "explorer_input": {"taskset": scored}}},
    ]})  # fmt: skip
    launch(cfg, root + ".yaml")
    run = os.path.join(root, "it", "run")
    with open(os.path.join(run, "stage0_sft", "stage_summary.json")) as f:
        sft_export = json.load(f)["final_model"]
    with open(os.path.join(run, "stage1_reward_model", "stage_summary.json")) as f:
        rm_export = json.load(f)["final_model"]
    with open(os.path.join(rm_export, "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForSequenceClassification"]
    rl = [m for m in read_metrics(os.path.join(run, "stage2_rl")) if "rollout/reward_model_mean" in m]
    assert [m["step"] for m in rl] == [1, 2]
    assert all(0.0 < m["rollout/reward_model_mean"] < 1.0 for m in rl)  # sigmoid of the scores

    # the first step's rollouts are scored as transformers scores them with the reward model's export
    with open(os.path.join(run, "stage2_rl", "completions.jsonl")) as f:
        first = [row for row in map(json.loads, f) if row["step"] == 1]
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, tok = AutoModelForSequenceClassification.from_pretrained(rm_export), AutoTokenizer.from_pretrained(rm_export)
    with torch.no_grad():
        assert len(first) == 8  # 4 tasks x 2 responses
        for row in first:
            response = row["response"]  # logged with its special tokens, which the reward's text has not
            for special in tok.all_special_tokens:
                response = response.replace(special, "")
            ids = tok(row["prompt"] + response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            want = 1 / (1 + math.exp(-float(model(input_ids=torch.tensor([ids])).logits[0, 0])))
            assert row["rewards"]["reward_model"] == pytest.approx(want, abs=1e-5)
    # the RL stage started from the SFT stage's policy, the reward model stage from it too
    for name in ("stage1_reward_model", "stage2_rl"):
        with open(os.path.join(run, name, "stage_summary.json")) as f:
            assert json.load(f)["start_model"] == sft_export, name
