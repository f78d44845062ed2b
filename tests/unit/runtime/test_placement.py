"""GPU placement of the processes `rlcore launch` starts: trainer ranks first, then each rollout
worker on GPUs of its own (NCCL weight sync), shared only for checkpoint sync; bad fits are one-line
errors naming the keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.core.config import ConfigError, load_config, resolve_stages
from rlcore.runtime.child import process_env
from rlcore.runtime.placement import GpuPlacement, place_gpus, visible_gpus
from rlcore.runtime.workers import gpu_placement

from ..config.test_config_loading import write_recipe


def test_visible_gpus_follow_cuda_visible_devices():
    assert visible_gpus({}, 3) == ["0", "1", "2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4, 6"}, 2) == ["4", "6"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, 2) == ["GPU-a1", "GPU-b2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 0) == []


def test_trainer_first_then_each_engine_its_own_gpus():
    gpus = [str(i) for i in range(8)]
    assert place_gpus(gpus, 2, 3, 2, may_share=False) == GpuPlacement(
        trainer=["0", "1"], engines=[["2", "3"], ["4", "5"], ["6", "7"]]
    )
    # a remote trainer leaves every GPU to the engines; the user's CUDA_VISIBLE_DEVICES order is kept
    assert place_gpus(["5", "3"], 0, 2, 1, may_share=False) == GpuPlacement([], [["5"], ["3"]])


def test_nccl_sync_refuses_shared_gpus_naming_the_keys_and_fixes():
    with pytest.raises(
        ConfigError, match=r"^1 trainer rank\(s\) .* and 1 rollout worker\(s\) of 1 GPU\(s\) .*need 2 GPUs"
    ):
        place_gpus(["0"], 1, 1, 1, may_share=False)
    with pytest.raises(
        ConfigError, match=r"this node shows 1 GPU\(s\) \(0\): .*mode colocate.*sync_method checkpoint"
    ):
        place_gpus(["0"], 1, 1, 1, may_share=False)
    with pytest.raises(
        ConfigError, match=r"^cluster.ranks_per_node 4 needs one GPU per trainer rank; this node shows 2"
    ):
        place_gpus(["0", "1"], 4, 1, 1, may_share=True)
    with pytest.raises(
        ConfigError, match=r"^explorer.rollout_model.tensor_parallel_size 4 needs that many GPUs"
    ):
        place_gpus(["0", "1"], 1, 1, 4, may_share=True)


def test_checkpoint_sync_shares_starting_after_the_trainer():
    placed = place_gpus(["0"], 1, 2, 1, may_share=True)
    assert placed == GpuPlacement(["0"], [["0"], ["0"]], shared=True)
    placed = place_gpus(["0", "1", "2"], 1, 2, 2, may_share=True)
    assert placed.engines == [["1", "2"], ["0", "1"]] and placed.shared
    assert all(len(set(g)) == len(g) for g in placed.engines)
    # enough GPUs: nothing shared even when it would be allowed
    assert not place_gpus(["0", "1", "2"], 1, 2, 1, may_share=True).shared


def _stages(tmp_path: Path, *overrides: str):
    return resolve_stages(load_config(write_recipe(tmp_path), list(overrides)))


def test_launch_places_workers_only_on_cuda_and_only_those_it_starts(tmp_path):
    stages = _stages(tmp_path, "explorer.rollout_model.engine_num=2")
    assert gpu_placement(stages, "cpu", {}, 0) is None
    assert gpu_placement(stages, "cuda", {"CUDA_VISIBLE_DEVICES": "1,2,3"}, 3) == GpuPlacement(
        ["1"], [["2"], ["3"]]
    )
    with pytest.raises(ConfigError, match="need 3 GPUs"):
        gpu_placement(stages, "cuda", {}, 2)
    shared = gpu_placement(_stages(tmp_path, "synchronizer.sync_method=checkpoint"), "cuda", {}, 1)
    assert shared == GpuPlacement(["0"], [["0"]], shared=True)
    # workers started elsewhere (endpoints) and mode colocate: nothing to place, torchrun's own view
    assert (
        gpu_placement(_stages(tmp_path, "explorer.rollout_model.endpoints=[127.0.0.1:5]"), "cuda", {}, 1)
        is None
    )
    assert gpu_placement(_stages(tmp_path, "mode=colocate"), "cuda", {}, 1) is None


def test_placed_gpus_replace_the_users_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,8,9")
    cluster = _stages(tmp_path)[0].config.cluster
    assert process_env(cluster, 1, ["8", "9"])["CUDA_VISIBLE_DEVICES"] == "8,9"
    assert process_env(cluster, 1)["CUDA_VISIBLE_DEVICES"] == "7,8,9"
