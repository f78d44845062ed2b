"""Engine and synchronizer settings that cannot work together are refused at load time, naming
the keys and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.core.config import ConfigError, load_config, resolve_stages

from .test_config_loading import write_recipe


def _check(tmp_path: Path, *overrides: str) -> None:
    resolve_stages(load_config(write_recipe(tmp_path), list(overrides)))


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["explorer.rollout_model.tensor_parallel_size=2"],
         r"^explorer.rollout_model.tensor_parallel_size applies to engine_type vllm only; got engine_type hf"),
        (["explorer.rollout_model.gpu_memory_utilization=0.5"],
         r"^explorer.rollout_model.gpu_memory_utilization applies to engine_type vllm only; got engine_type hf"),
        (["mode=colocate", "explorer.rollout_model.engine_type=vllm", "cluster.ranks_per_node=2"],
         r"^mode colocate with engine_type vllm and 2 trainer ranks runs one vLLM engine in every rank: set "
         r"explorer.rollout_model.engine_num=2 \(got 1\)$"),
        (["explorer.rollout_model.engine_type=vllm", "explorer.rollout_model.enable_sleep_mode=true"],
         r"^explorer.rollout_model.enable_sleep_mode shares one GPU .* got mode both"),
        (["mode=colocate", "synchronizer.sync_method=checkpoint"],
         r"^synchronizer.sync_method checkpoint has separate rollout workers load an HF folder \(mode both\)"),
        (["mode=colocate", "synchronizer.checksums=true"],
         r"^synchronizer.checksums guard weights sent over a process group"),
        (["synchronizer.sync_interval=3", "synchronizer.max_staleness=1"],
         r"^synchronizer.max_staleness 1 would drop every experience .* raise max_staleness to >= 2"),
        (["synchronizer.sync_style=trainer_driven", "synchronizer.sync_interval=2"],
         r"^synchronizer.sync_style trainer_driven syncs after every step; sync_interval 2"),
        (["synchronizer.sync_style=sometimes"],
         r"^synchronizer.sync_style must be one of fixed, explorer_driven, trainer_driven; got 'sometimes'"),
        (["mode=colocate", "synchronizer.rollout_ahead=1"],
         r"^synchronizer.rollout_ahead overlaps rollout workers' generation with training \(mode both\); got mode colocate"),
        (["synchronizer.rollout_ahead=1", "synchronizer.sync_style=explorer_driven"],
         r"^synchronizer.rollout_ahead starts the next rollout before this step's sync.*use sync_style fixed"),
        (["synchronizer.rollout_ahead=1", "synchronizer.sync_interval=2", "synchronizer.max_staleness=1"],
         r"^synchronizer.max_staleness 1 would drop experiences generated ahead.*raise max_staleness to >= 2"),
        (["synchronizer.rollout_ahead=2"],
         r"^synchronizer.rollout_ahead must be <= 1"),
    ],
)  # fmt: skip
def test_conflicting_engine_and_sync_settings_are_refused(tmp_path: Path, overrides, pattern) -> None:
    with pytest.raises(ConfigError, match=pattern):
        _check(tmp_path, *overrides)


def test_consistent_settings_load(tmp_path: Path) -> None:
    _check(
        tmp_path, "explorer.rollout_model.engine_type=vllm", "explorer.rollout_model.tensor_parallel_size=2",
        "synchronizer.sync_style=explorer_driven", "synchronizer.max_staleness=2", "synchronizer.checksums=true",
        "synchronizer.probe=true", "synchronizer.sync_method=nccl",
    )  # fmt: skip
    _check(tmp_path, "mode=colocate", "explorer.rollout_model.engine_type=vllm", "synchronizer.probe=true")
    _check(
        tmp_path, "trainer.remote=127.0.0.1:1", "synchronizer.rollout_ahead=1", "synchronizer.max_staleness=1"
    )
    _check(tmp_path, "trainer.remote=127.0.0.1:1", "synchronizer.probe=true")  # ComputeLogprobs scores it
    _check(
        tmp_path, "trainer.remote=127.0.0.1:1", "synchronizer.sync_style=explorer_driven",
        "synchronizer.max_staleness=1", "synchronizer.sync_method=checkpoint",
    )  # fmt: skip
    _check(
        tmp_path, "mode=colocate", "explorer.rollout_model.engine_type=vllm", "cluster.ranks_per_node=2",
        "explorer.rollout_model.engine_num=2",
    )  # fmt: skip


def _stages(tmp_path: Path, engine_type: str, first: dict, second: dict, **engine: object) -> list:
    tasks = {"path": str(tmp_path / "tasks.jsonl")}
    recipe = write_recipe(
        tmp_path,
        {
            "mode": "colocate",
            "cluster": {"device": "cuda" if engine.get("enable_sleep_mode") else "cpu"},
            "explorer": {"rollout_model": {"engine_type": engine_type, **engine}},
            "stages": [
                {"name": "rl", **first},
                {"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"},
                 "buffer": {"explorer_input": {"eval_tasksets": [{"name": "held", **tasks}]}}, **second},
            ],
        },
    )  # fmt: skip
    return resolve_stages(load_config(recipe))


def test_stages_that_run_vllm_in_process_must_ask_for_the_same_engine(tmp_path: Path) -> None:
    """They share one engine, built once per launch: a setting that differs is refused at load
    time, naming the later stage's key and the first stage's value."""
    with pytest.raises(
        ConfigError,
        match=r"^stages\[1\]\.explorer\.rollout_model\.max_batch_size: 64 differs from stage 0's 256; the "
        r"stages that run vLLM in the trainer's process share one engine, built once per launch: give them "
        r"the same explorer.rollout_model.max_batch_size \(or run this stage as a separate launch\)$",
    ):
        _stages(tmp_path, "vllm", {}, {"explorer": {"rollout_model": {"max_batch_size": 64}}})
    with pytest.raises(ConfigError, match=r"^stages\[1\]\.model\.max_model_len: 2048 differs from stage 0's"):
        _stages(tmp_path, "vllm", {}, {"model": {"max_model_len": 2048}})
    # equal settings load; so do differing ones where no engine is shared: HF engines are built per
    # stage, and an SFT stage without evaluation runs no engine
    assert len(_stages(tmp_path, "vllm", {}, {"trainer": {"save_interval": 3}})) == 2
    assert len(_stages(tmp_path, "hf", {}, {"explorer": {"rollout_model": {"max_batch_size": 64}}})) == 2
    no_eval = {"buffer": {"explorer_input": {"eval_tasksets": []}}, "model": {"max_model_len": 2048}}
    assert len(_stages(tmp_path, "vllm", {}, no_eval)) == 2
    # sleep mode on one GPU: the SFT stage shares the engine, which sleeps through its training
    assert len(_stages(tmp_path, "vllm", {}, {}, enable_sleep_mode=True)) == 2


def test_a_run_wide_sync_setting_applies_to_the_stages_that_sync(tmp_path: Path) -> None:
    """`synchronizer.sync_method=checkpoint` on the command line of a launch whose first stage is SFT
    (mode train, no weights to send): the SFT stage keeps the default, the GRPO stage takes it. The
    same setting given by the SFT stage itself is still refused there."""
    tasks = {"path": str(tmp_path / "tasks.jsonl")}
    stages = [
        {"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
        {"name": "rl", "mode": "both", "buffer": {"explorer_input": {"eval_tasksets": [{"name": "held", **tasks}]}}},
    ]  # fmt: skip
    recipe = write_recipe(tmp_path, {"stages": stages})
    run_wide = ["synchronizer.sync_method=checkpoint", "synchronizer.checksums=false", "synchronizer.probe=true"]
    sft, rl = resolve_stages(load_config(recipe, run_wide))
    assert (sft.config.synchronizer.sync_method, sft.config.synchronizer.probe) == ("auto", False)
    assert (rl.config.synchronizer.sync_method, rl.config.synchronizer.probe) == ("checkpoint", True)
    with pytest.raises(ConfigError, match=r"^stages\[0\]\.synchronizer\.sync_method checkpoint has separate"):
        resolve_stages(load_config(recipe, ["stages.0.synchronizer.sync_method=checkpoint"]))


def test_a_run_wide_sync_method_nccl_reaches_a_decoupled_runs_stages(tmp_path: Path) -> None:
    """`synchronizer.sync_method=nccl` on the command line of a decoupled run (SFT warm-up, then RL in
    mode train or explore): the RL stage's trainer pushes to the explorer over a group and its
    explorer expects that (plan.explorer_weights); without it both use folders."""
    from rlcore.core.config.plan import plan_stage

    stages = [
        {"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
        {"name": "rl", "algorithm": {"algorithm_type": "grpo"}},
    ]  # fmt: skip
    recipe = write_recipe(tmp_path, {"mode": "train", "stages": stages})
    for mode in ("train", "explore"):
        *_, rl = resolve_stages(load_config(recipe, ["synchronizer.sync_method=nccl", f"mode={mode}"]))
        assert plan_stage(rl.config).explorer_weights == "nccl"
        *_, rl = resolve_stages(load_config(recipe, [f"mode={mode}"]))
        assert plan_stage(rl.config).explorer_weights == "publish"
