"""The run plan (core/config/plan.py): it decides what the code decided before it existed, for every
recipe and the shapes the integration tests run; nothing else branches on mode, asynchronous or
remote; validation only checks; the plan travels as JSON."""

from __future__ import annotations

import ast
import copy
import dataclasses
import glob
import os

import pytest
import yaml

from rlcore.cli.main import main
from rlcore.core.algorithms import reads_reference, trains_on, with_preset
from rlcore.core.config import ConfigError, load_config, resolve_stages
from rlcore.core.config.plan import RunPlan, StagePlan, plan_launch
from rlcore.core.config.validate import validate_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RECIPES = sorted(glob.glob(os.path.join(REPO, "configs", "**", "*.yaml"), recursive=True))
SHAPES = {
    "as written": [],
    "colocate": ["mode=colocate"],
    "colocate, an engine per rank": ["mode=colocate", "cluster.ranks_per_node=2", "explorer.rollout_model.engine_num=2"],
    "asynchronous": ["synchronizer.asynchronous=true"],
    "checkpoint sync": ["synchronizer.sync_method=checkpoint"],
    "remote trainer": ["trainer.remote=127.0.0.1:5"],
    "decoupled trainer": ["mode=train"],
    "decoupled explorer": ["mode=explore"],
    "bench": ["mode=bench"],
    "over-rollout": ["synchronizer.asynchronous=true", "explorer.over_rollout.ratio=0.25"],
}
"""Overrides given to the RL stages of SHAPED recipes (every recipe runs as written)."""
SHAPED = ["quickstart.yaml", "algorithms/ppo.yaml", "algorithms/dpo.yaml"]


def before(cfg) -> dict:
    """The decisions as the code made them before the plan (runtime/loop.py's StageLoop, its
    explores_on_workers, the transports' transport_name, validate.py's fills), written out again."""
    algo = with_preset(cfg.algorithm)
    data = trains_on(algo)
    asynchronous = cfg.synchronizer.asynchronous
    # what an explorer writes: rollouts, or DPO's pairs (algorithm.dpo.pairs buffer, added since)
    buffered = data == "rollouts" or (data == "pairs" and cfg.algorithm.dpo.pairs == "buffer")
    reads_buffer = buffered and (cfg.mode == "train" or asynchronous)
    explores = data == "rollouts" and not reads_buffer
    # a reward model's stage evaluates its held-out pairs by the trainer's scores (added since)
    evaluates = bool(cfg.buffer.explorer_input.eval_tasksets) and algo.algorithm_type != "reward_model"
    has_engine = explores or evaluates or cfg.mode == "bench"
    explores_on_workers = cfg.mode in ("both", "explore") or cfg.trainer.remote is not None
    on_workers = (has_engine or asynchronous) and explores_on_workers
    endpoints = on_workers and not asynchronous  # the trainer's engines (asynchronous: its own, to evaluate)
    if cfg.mode == "explore":
        engines = "workers"
    elif endpoints:
        engines = "workers"
    else:
        engines = "in_process" if has_engine else "none"
    tinker = str(cfg.trainer.remote).startswith("tinker")  # a Tinker service: engines load its sampler paths
    weights = {"workers": "checkpoint" if cfg.synchronizer.sync_method == "checkpoint" or tinker else "nccl",
               "in_process": "memory", "none": "none"}[engines]  # fmt: skip
    decoupled = cfg.mode in ("train", "explore") or asynchronous
    old = algo.do_old_log_prob_compute
    if old is None:
        old = not (decoupled and data == "rollouts")
    staleness = cfg.synchronizer.max_staleness
    if asynchronous and staleness is None:
        staleness = 1
    return {
        "reads_buffer": reads_buffer and cfg.mode != "explore",
        "explores": explores and cfg.mode not in ("bench", "explore"),
        "engines": engines,
        "explorer_engines": "workers" if asynchronous and on_workers else "none",
        "on_workers": explores_on_workers,
        "weights": "publish" if cfg.mode == "explore" else weights,
        "publishes": buffered and (cfg.mode == "train" or asynchronous),
        "trainer": "none" if cfg.mode == "explore" else "tinker" if tinker else "remote" if cfg.trainer.remote else "local",
        "reference": reads_reference(algo),
        "old_logprobs": old and data == "rollouts",
        "critic": algo.algorithm_type == "ppo",  # the menu's only algorithms with a step pass
        "experts": algo.algorithm_type == "mix",
        "max_staleness": staleness,
        "schedules_tasks": cfg.explorer.over_rollout.ratio > 0 or cfg.explorer.dynamic_timeout.enable,
        "every_rank": cfg.mode == "colocate" and cfg.explorer.rollout_model.engine_num > 1,
    }


def decided(plan: StagePlan) -> dict:
    return {
        "reads_buffer": plan.reads_buffer, "explores": plan.explores, "engines": plan.engines,
        "explorer_engines": plan.explorer_engines, "on_workers": plan.on_workers, "weights": plan.weights,
        "publishes": plan.publishes, "trainer": plan.trainer, "reference": plan.passes.reference,
        "old_logprobs": plan.passes.old_logprobs, "critic": "critic" in plan.passes.extra, "experts": "experts" in plan.passes.extra,
        "max_staleness": plan.max_staleness, "schedules_tasks": plan.schedules_tasks,
        "every_rank": plan.engine_per_rank,
    }  # fmt: skip


def stage_overrides(path: str, shape: list[str]) -> list[str]:
    """`shape` for every stage of the recipe at `path` that trains on rollouts."""
    raw = load_config(path, [])
    if not raw.stages:
        return list(shape)
    rl = [i for i, s in enumerate(raw.stages) if s.get("algorithm", {}).get("algorithm_type") not in ("sft", "dpo")]
    return [f"stages.{i}.{o}" for i in rl for o in shape]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_plan_decides_what_the_code_decided_before_for_every_recipe(
    shape: str, tiny_model_path: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    planned = 0
    recipes = RECIPES if shape == "as written" else [os.path.join(REPO, "configs", r) for r in SHAPED]
    for recipe in recipes:
        overrides = [f"model.model_path={tiny_model_path}"] if "adaptive_teaching" in recipe else []
        try:
            stages = resolve_stages(load_config(recipe, overrides + stage_overrides(recipe, SHAPES[shape])), False)
        except ConfigError:
            continue  # a shape this recipe's stages cannot run (validation says why)
        for stage in stages:
            assert decided(stage.plan) == before(stage.config), f"{os.path.relpath(recipe, REPO)} {stage.name}"
            planned += 1
    assert planned >= 2, f"only {planned} stages planned in shape {shape}"


def test_a_launch_plan_has_a_role_and_travels_as_json(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    quickstart = os.path.join(REPO, "configs", "quickstart.yaml")
    stages = resolve_stages(load_config(quickstart, []), False)
    plan = plan_launch([s.plan for s in stages], explorer=False)
    assert plan.role == "trainer" and plan.worker_stages == [1] and not plan.gpu_sharing
    assert [p.source for p in plan.stages] == ["responses", "rollouts"]
    assert RunPlan.from_dict(yaml.safe_load(yaml.safe_dump(plan.as_dict()))) == plan
    older = plan.as_dict()  # a plan.json of an rlcore whose Passes had no routing_replay yet
    del older["stages"][1]["passes"]["routing_replay"]
    with pytest.raises(ValueError, match=r"^stage plan: Passes fields \['routing_replay'\] differ from this rlcore's "
                       r"\(written by another rlcore version\?\); launch the run again$"):
        RunPlan.from_dict(older)
    with pytest.raises(ConfigError, match=r"stages\[1\] \(rl\): mode explore runs in a launch of its own"):
        plan_launch([s.plan for s in resolve_stages(load_config(quickstart, ["stages.1.mode=explore"]), False)], False)
    decoupled = resolve_stages(load_config(os.path.join(REPO, "configs", "decoupled.yaml"), ["mode=explore"]), False)
    explorer = plan_launch([s.plan for s in decoupled], explorer=True)
    assert explorer.role == "explorer" and [p.source for p in explorer.stages] == ["explore"]
    remote = resolve_stages(load_config(quickstart, ["trainer.remote=127.0.0.1:5"]), False)
    assert plan_launch([s.plan for s in remote], explorer=False).role == "remote"


def test_validation_only_checks_and_the_stage_config_holds_what_the_plan_filled(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    cfg = load_config(os.path.join(REPO, "configs", "asynchronous.yaml"), ["stages.1.algorithm.algorithm_type=gspo"])
    stages = resolve_stages(cfg, False)
    rl = stages[1].config
    assert rl.algorithm.clip_ratio_high == 4e-4 and rl.algorithm.do_old_log_prob_compute is False
    assert rl.synchronizer.max_staleness == 2  # the recipe's own
    raw = dataclasses.replace(rl, algorithm=dataclasses.replace(rl.algorithm, clip_ratio_high=None))
    untouched = copy.deepcopy(raw)
    validate_config(raw, check_paths=False)
    assert raw == untouched  # nothing written in


PLAN_MODULES = {"core/config/plan.py", "core/config/shape_checks.py"}
SHAPE_KEYS = {"mode", "asynchronous", "remote"}


def _conditions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs
        elif isinstance(node, (ast.Compare, ast.BoolOp)):
            yield node
        elif isinstance(node, ast.Match):
            yield node.subject


def test_only_the_plan_branches_on_mode_asynchronous_or_remote() -> None:
    """No condition outside the plan's modules reads a `.mode`, `.asynchronous` or `.remote`
    attribute (reading trainer.remote as the address to dial is not a branch)."""
    found = []
    for folder in ("core", "runtime", "rollout", "backends", "buffer", "client", "cli", "benchmarks"):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, REPO)
            if rel in PLAN_MODULES:
                continue
            with open(path) as f:
                tree = ast.parse(f.read())
            for condition in _conditions(tree):
                found += [
                    f"{rel}:{a.lineno} .{a.attr}"
                    for a in ast.walk(condition)
                    if isinstance(a, ast.Attribute) and a.attr in SHAPE_KEYS
                ]
    assert not sorted(set(found)), "branch on the run plan instead:\n" + "\n".join(sorted(set(found)))


def test_config_show_plan_prints_the_launch_plan(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    assert main(["config", "show", os.path.join(REPO, "configs", "decoupled.yaml"), "mode=explore", "--plan"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["role"] == "explorer" and shown["stages"][0]["source"] == "explore"
    assert shown["stages"][0]["weights"] == "publish"
