"""A reward model's stage (algorithm_type reward_model) is checked before anything starts: its
pairs (and their margins), its held-out pairs, and what it cannot train with, each a one-line
error naming the key; its plan has no engines and says it trains a reward model."""

from __future__ import annotations

import json

import pytest
import yaml

from rlcore.core.config import ConfigError, load_config, resolve_stages

PAIR = {"prompt": "1+1=", "answer": "2", "chosen": "<answer>2</answer>", "rejected": "<answer>3</answer>", "margin": 0.5}


def _stages(tmp_path, rows=None, eval_rows=None, **sections):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in (rows or [PAIR])) + "\n")
    taskset: dict = {"path": str(tmp_path / "t.jsonl")}
    cfg: dict = {"model": {"model_path": str(tmp_path / "m")}, "mode": "train", "buffer": {"batch_size": 1},
                 "algorithm": {"algorithm_type": "reward_model"}}  # fmt: skip
    if eval_rows is not None:
        (tmp_path / "e.jsonl").write_text("\n".join(json.dumps(r) for r in eval_rows) + "\n")
        cfg["buffer"]["explorer_input"] = {"eval_tasksets": [{"name": "held", "path": str(tmp_path / "e.jsonl")}]}
    cfg["buffer"].setdefault("explorer_input", {})["taskset"] = taskset
    for key, value in sections.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return resolve_stages(load_config(str(path), []))


def test_a_reward_model_stage_plans_no_engines_and_evaluates_its_pairs(tmp_path):
    (stage,) = _stages(tmp_path, eval_rows=[PAIR], **{"algorithm.reward_model.margin_key": "margin"})
    plan = stage.plan
    assert (plan.trained_model, plan.trains_on, plan.engines, plan.weights) == ("reward", "pairs", "none", "none")
    assert not plan.passes.reference  # no reference model: the loss compares the model's own scores


def test_its_pairs_margins_and_held_out_pairs_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"^buffer\.explorer_input\.taskset: .* has no 'rejected' column"):
        _stages(tmp_path, rows=[{"prompt": "1+1=", "chosen": "2"}])  # no answer needed: not rewarded
    with pytest.raises(ConfigError, match=r"^algorithm\.reward_model\.margin_key: .* row 1 has no number in column 'gap'"):
        _stages(tmp_path, **{"algorithm.reward_model.margin_key": "gap"})
    with pytest.raises(ConfigError, match=r"^buffer\.explorer_input\.eval_tasksets\[0\]: .* has no 'chosen' column"):
        _stages(tmp_path, eval_rows=[{"prompt": "1+1=", "answer": "2"}])


def test_what_a_reward_model_cannot_train_with_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^model\.lora_configs: a reward model trains its full weights"):
        _stages(tmp_path, **{"model.lora_configs": [{"name": "a", "lora_rank": 4}]})
    with pytest.raises(ConfigError, match=r"^mode 'both' explores, and algorithm\.algorithm_type reward_model"):
        _stages(tmp_path, mode="both")
    with pytest.raises(ConfigError, match=r"algorithm\.reward_model is read only by training a reward model"):
        _stages(tmp_path, **{"algorithm.algorithm_type": "grpo", "mode": "both", "algorithm.reward_model.center_coef": 0.1})
    with pytest.raises(ConfigError, match=r"algorithm\.dpo is read only by training a policy on pairs"):
        _stages(tmp_path, **{"algorithm.dpo.beta": 0.2})


def _three_stages(tmp_path, rm_name: str = "rm", rm_type: str = "reward_model"):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "t.jsonl").write_text(json.dumps(PAIR) + "\n")
    taskset = {"path": str(tmp_path / "t.jsonl")}
    scored = {**taskset, "reward_fn": ["reward_model"], "reward_model": {"path": f"stage:{rm_name}"}}
    cfg = {
        "model": {"model_path": str(tmp_path / "m")}, "buffer": {"batch_size": 1, "explorer_input": {"taskset": taskset}},
        "stages": [
            {"name": "rm", "mode": "train", "algorithm": {"algorithm_type": rm_type}},
            {"name": "rl", "mode": "both", "algorithm": {"algorithm_type": "grpo"},
             "buffer": {"explorer_input": {"taskset": scored}}},
        ],
    }  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return resolve_stages(load_config(str(path), []))


def test_a_reward_model_named_by_its_stage_must_be_an_earlier_reward_model_stage(tmp_path):
    rm, rl = _three_stages(tmp_path)
    assert rm.plan.trained_model == "reward" and rl.plan.trained_model == "policy"
    assert rl.config.buffer.explorer_input.taskset.reward_model.path == "stage:rm"  # the loop writes the export in
    from rlcore.core.config.stage_refs import with_stage_exports

    resolved = with_stage_exports(rl.config, {"rm": "/runs/rm/hf"})
    assert resolved.buffer.explorer_input.taskset.reward_model.path == "/runs/rm/hf"
    assert rl.config.buffer.explorer_input.taskset.reward_model.path == "stage:rm"  # a copy
    with pytest.raises(ConfigError, match=r"^stages\[1\]\.buffer\.explorer_input\.taskset\.reward_model\.path: "
                                          r"'stage:critic' names no earlier stage of this run \(earlier: rm\)"):
        _three_stages(tmp_path, rm_name="critic")
    with pytest.raises(ConfigError, match=r"stage rm trains a policy, not a reward model"):
        _three_stages(tmp_path, rm_type="dpo")
