"""tool_call in a real launch: an SFT stage on chat-message demonstrations (rendered with the
calculator declared by the ChatML template of the scratch BPE tokenizer) teaches a tiny model to
call the tool; the RL stage's episodes then run on the rollout worker, the calculator answers, and
the trainer trains on the model's turns only: its log-probs equal the engine's on every trained
token, which would not hold if the tool's output (placeholder log-probs) were in the loss."""

from __future__ import annotations

import json
import os

import pytest

from .launch_utils import launch, read_metrics

pytestmark = pytest.mark.integration


def test_sft_on_messages_then_tool_call_grpo_runs_the_calculator(tmp_path):
    root = str(tmp_path)
    workflow = {"default_workflow_type": "tool_call",
                "workflow_args": {"tools": ["calculator"], "max_turns": 3, "max_tokens_per_turn": 32}}  # fmt: skip
    train = {"name": "multiply", "path": os.path.join(root, "train.jsonl"), "generator": "tool_arithmetic",
             "generator_args": {"num_tasks": 400, "low": 10, "high": 40}, "reward_fn": ["exact_match"],
             "rollout_args": {"max_tokens": 32}, **workflow}  # fmt: skip
    cfg = {
        "project": "it", "name": "run", "checkpoint_root_dir": root, "seed": 3,
        "model": {"model_path": os.path.join(root, "model"), "max_model_len": 256, "max_prompt_tokens": 200,
                  "max_response_tokens": 48, "apply_chat_template": True,
                  "scratch": {"enabled": True, "tokenizer": "bpe", "hidden_size": 64, "num_layers": 2,
                              "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 128}},
        "cluster": {"device": "cpu", "threads_per_rank": 1},
        "buffer": {"explorer_input": {"taskset": train}},
        "monitor": {"monitor_type": ["jsonl"], "log_completions": True, "save_completions_probability": 1.0},
        "stages": [
            {"name": "sft", "mode": "train",
             "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 3e-3, "lr_warmup_steps": 10}},
             "buffer": {"batch_size": 16, "total_epochs": 8, "total_steps": 150, "explorer_input": {"taskset": {
                 "name": "demos", "path": os.path.join(root, "demos.jsonl"), "format": {"prompt_type": "messages"},
                 "generator_args": {"demos": True}}}}},
            {"name": "rl", "algorithm": {"repeat_times": 4, "optimizer": {"lr": 1e-4}},
             "buffer": {"batch_size": 4, "total_steps": 2}},
        ],
    }  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"), timeout_s=900)
    rl = [m for m in read_metrics(os.path.join(root, "it", "run", "stage1_rl")) if "rollout/tool_used_mean" in m]
    assert len(rl) == 2
    for m in rl:
        assert m["rollout/tool_used_mean"] > 0.5, m  # the calculator answered most episodes' calls
        assert m["rollout/turns_mean"] > 1.5 and m["rollout/tool_calls_mean"] >= m["rollout/tool_used_mean"]
        assert m["rollout/logprob_diff_max"] < 1e-3, m
    with open(os.path.join(root, "it", "run", "stage1_rl", "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 2 * 16  # every rollout of both steps: the calls and the tool's answers in them
    assert any("<tool_call>" in r["response"] and "<tool_response>" in r["response"] and r["counts"]["tool_used"] for r in rows)
