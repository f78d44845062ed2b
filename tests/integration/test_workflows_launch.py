"""Workflows chosen per taskset in a real launch: a user's workflow by import path, with its own
`workflow_args`, runs on the rollout worker for training and for evaluation (each taskset its own),
and a workflow that cannot be imported stops the launch in one line before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from .launch_utils import REPO, heldout_taskset, launch, read_metrics, tiny_grpo_config

pytestmark = pytest.mark.integration

BONUS = "tests.integration.workflows:BonusWorkflow"
TWO_TURNS = "tests.integration.workflows:TwoTurnWorkflow"


def test_each_taskset_runs_its_own_workflow_with_its_args(tmp_path):
    root = str(tmp_path)
    heldout = {**heldout_taskset(root, 8), "reward_fn": ["exact_match"],
               "default_workflow_type": BONUS, "workflow_args": {"bonus": 2.0}}  # fmt: skip
    cfg = tiny_grpo_config(
        root,
        **{"buffer.total_steps": 2, "buffer.explorer_input.taskset.default_workflow_type": BONUS,
           "buffer.explorer_input.taskset.workflow_args": {"bonus": 0.5},
           "buffer.explorer_input.eval_tasksets": [heldout], "explorer.eval_on_startup": True},
    )  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    metrics = read_metrics(os.path.join(root, "it", "run"))
    steps = [m for m in metrics if "rollout/reward_mean" in m]
    assert [m["rollout/bonus_mean"] for m in steps] == [0.5, 0.5]
    evals = [m for m in metrics if "eval/heldout/reward_mean" in m]
    assert len(evals) >= 2  # before the first step and after the last
    for m in evals:  # exact_match (the accuracy) plus the eval taskset's own bonus
        assert m["eval/heldout/reward_mean"] == pytest.approx(m["eval/heldout/accuracy"] + 2.0, abs=1e-9)


@pytest.mark.parametrize(
    "workflow, args, key, reason",
    [
        ("tests.integration.workflows:Nope", {}, "taskset.default_workflow_type", "has no attribute 'Nope'"),
        ("multi_turn", {"env": "tests.unit.rollout.test_multi_turn:Nope"}, "taskset.workflow_args.env",
         "has no attribute 'Nope'"),
        ("multi_turn", {"env": "arithmetic_chain", "max_turns": -1}, "taskset.workflow_args.max_turns",
         "must be a positive integer; got -1"),
    ],
)  # fmt: skip
def test_a_workflow_or_environment_that_cannot_be_used_is_one_line(tmp_path, workflow, args, key, reason):
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root, **{"buffer.explorer_input.taskset.default_workflow_type": workflow,
                 "buffer.explorer_input.taskset.workflow_args": args}
    )  # fmt: skip
    path = os.path.join(root, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "launch", path],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"buffer.explorer_input.{key}" in lines[0] and reason in lines[0], lines[0]


@pytest.mark.parametrize("mask_context", [True, False])
def test_a_multi_turn_experience_trains_the_model_tokens_it_generated(tmp_path, mask_context):
    """Two model turns around an environment reply, one experience per conversation, through a
    rollout worker and RunTasks into the trainer. The trainer recomputes every trained token's
    log-prob from the sequence and compares it with the engine's: with the reply masked out the two
    agree (the trained ids and their positions are exactly the generated ones, and the reply's
    placeholder log-probs are never read); left in the loss, the placeholders show as nats apart."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{"buffer.total_steps": 2, "buffer.explorer_input.taskset.default_workflow_type": TWO_TURNS,
           "buffer.explorer_input.taskset.workflow_args": {"reply": "+0=", "mask_context": mask_context}},
    )  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "rollout/logprob_diff_max" in m]
    assert len(steps) == 2 and all(m["rollout/response_len_mean"] > 3 for m in steps)  # turns + the reply
    if mask_context:
        assert all(m["rollout/logprob_diff_max"] < 1e-3 for m in steps), steps
    else:
        assert all(m["rollout/logprob_diff_max"] > 0.5 for m in steps), steps


def test_multi_turn_episodes_run_on_the_worker_and_train_on_the_models_turns(tmp_path):
    """multi_turn with a user's environment by import path: each episode runs its three turns on the
    rollout worker (RunTasks), arrives as one experience with the environment's turns masked, and
    trains with the trainer's log-probs equal to the engine's on every trained token. The eval
    taskset plays the built-in arithmetic_chain, its rows' `addends` reaching the worker's
    environment with the task (an untrained model's first answer is unreadable: one turn, reward 0)."""
    root = str(tmp_path)
    chains = {
        "name": "chain", "path": os.path.join(root, "chain.jsonl"), "generator": "arithmetic_chain",
        "generator_args": {"part": "test", "num_tasks": 4, "steps": 3, "max_operand": 9},
        "rollout_args": {"temperature": 0.0, "max_tokens": 6}, "reward_fn": ["format"],
        "default_workflow_type": "multi_turn", "workflow_args": {"env": "arithmetic_chain", "max_turns": 3},
    }  # fmt: skip
    cfg = tiny_grpo_config(
        root,
        **{"buffer.total_steps": 2, "buffer.explorer_input.taskset.default_workflow_type": "multi_turn",
           "buffer.explorer_input.taskset.workflow_args": {
               "env": "tests.unit.rollout.test_multi_turn:CountingEnv", "max_turns": 3, "max_tokens_per_turn": 3},
           "buffer.explorer_input.eval_tasksets": [chains], "explorer.eval_on_startup": True,
           "monitor.log_completions": True, "monitor.save_completions_probability": 0.5},
    )  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    metrics = read_metrics(os.path.join(root, "it", "run"))
    steps = [m for m in metrics if "rollout/logprob_diff_max" in m]
    assert len(steps) == 2
    # monitor.log_completions: about half of each step's 16 conversations, the environment's turns in them
    with open(os.path.join(root, "it", "run", "completions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert {r["step"] for r in rows} == {1, 2} and 4 <= len(rows) <= 28
    assert all(r["response"].count("+1=") == 2 and r["counts"]["turns"] == 3 and r["finish_reason"] == "max_turns" for r in rows)
    for m in steps:
        assert m["rollout/turns_mean"] == 3 and m["rollout/max_turns_frac"] == 1
        assert m["rollout/env_mean"] == pytest.approx(0.75)
        assert m["rollout/response_len_mean"] <= 9  # the model's tokens only: 3 turns of at most 3
        assert m["rollout/logprob_diff_max"] < 1e-3, m
    evals = [m for m in metrics if "eval/chain/reward_mean" in m]
    assert len(evals) >= 2 and all(m["eval/chain/reward_mean"] == 0 for m in evals)


def test_a_thinking_templates_new_user_turns_go_on_as_samples_that_train_on_the_engines_tokens(tmp_path):
    """multi_turn on the thinking template (chatml_thinking, the BPE scratch tokenizer): each user
    turn re-renders the history (the reasoning block of the turns before it dropped), so each of an
    episode's three replies is a sample of its own, its prompt the conversation rendered again. The
    samples cross the worker's stream as one episode (Experience.episode_id): the explorer counts
    repeat_times episodes per task, the step's metrics count each episode once, and the trainer's
    log-probs equal the engine's on every trained token of every sample. model.chat_template_kwargs
    reach the worker's template: with enable_thinking false every prompt ends in an empty reasoning block."""
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{"model.max_model_len": 160, "model.max_prompt_tokens": 64, "model.apply_chat_template": True,
           "model.chat_template_kwargs": {"enable_thinking": False},
           "monitor.log_completions": True, "monitor.save_completions_probability": 1.0,
           "model.scratch.tokenizer": "bpe", "model.scratch.vocab_size": 512, "model.scratch.chat_template": "chatml_thinking",
           "buffer.total_steps": 2, "buffer.explorer_input.taskset.default_workflow_type": "multi_turn",
           "buffer.explorer_input.taskset.workflow_args": {
               "env": "tests.unit.rollout.test_multi_turn:CountingEnv", "max_turns": 3, "max_tokens_per_turn": 4}},
    )  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "rollout/logprob_diff_max" in m]
    assert [m["step"] for m in steps] == [1, 2]  # one update a step: its 48 samples in one mini-batch
    for m in steps:
        assert m["rollout/samples_per_episode_mean"] == 3, m
        assert m["rollout/turns_mean"] == 3 and m["rollout/env_mean"] == pytest.approx(0.75)
        assert m["rollout/response_len_mean"] <= 12  # the model's tokens of an episode: 3 replies of at most 4
        assert m["rollout/logprob_diff_max"] < 1e-3, m
    with open(os.path.join(root, "it", "run", "completions.jsonl")) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    assert len(prompts) == 2 * 3 * 4 * 4  # every sample of every episode
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in prompts), prompts[:3]
    assert sum(p.count("<|im_start|>user") == 3 for p in prompts) == 2 * 4 * 4  # third samples: the whole chat


def test_a_mixture_samples_each_taskset_by_weight_with_its_own_workflow(tmp_path):
    """Two training tasksets in every batch (3:1 of 4 tasks): the second runs a user's workflow
    with its own args, rewards and sampling temperature; each taskset's rewards are reported on
    their own, and the trainer scores each rollout at the temperature it was sampled at (its
    log-probs match the engine's)."""
    root = str(tmp_path)
    bonus = {"name": "bonus", "path": os.path.join(root, "bonus.jsonl"), "generator": "arithmetic",
             "generator_args": {"num_tasks": 16, "max_operand": 9, "seed": 5}, "weight": 1.0,
             "rollout_args": {"max_tokens": 8, "temperature": 0.6}, "reward_fn": ["format"], "default_workflow_type": BONUS,
             "workflow_args": {"bonus": 3.0}}  # fmt: skip
    cfg = tiny_grpo_config(
        root, **{"buffer.total_steps": 2, "buffer.explorer_input.taskset.weight": 3.0,
                 "buffer.explorer_input.mixture": [bonus]},
    )  # fmt: skip
    launch(cfg, os.path.join(root, "cfg.yaml"))
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "rollout/reward_mean" in m]
    assert len(steps) == 2
    for m in steps:  # repeat_times 4: 3 tasks x 4 of the taskset, 1 x 4 of bonus
        assert m["rollout/taskset/experiences"] == 12 and m["rollout/bonus/experiences"] == 4
        assert m["rollout/bonus/reward_mean"] >= 3.0 > m["rollout/taskset/reward_mean"]  # format <= 1, + 3 bonus
        assert m["rollout/reward_mean"] == pytest.approx((12 * m["rollout/taskset/reward_mean"] + 4 * m["rollout/bonus/reward_mean"]) / 16)
        assert m["rollout/logprob_diff_max"] < 1e-3, m
