import json
import os
import shutil

import pytest

from rlcore.weights.publish import LATEST, pin_newest


def _publish(folder: str, version: int) -> str:
    path = os.path.join(folder, f"version_{version}")
    os.makedirs(path)
    with open(os.path.join(path, "model.safetensors"), "w") as f:
        f.write(f"weights {version}")
    with open(os.path.join(folder, LATEST), "w") as f:
        json.dump({"version": version, "path": path}, f)
    return path


def test_a_pinned_version_outlives_its_pruning_and_only_the_newest_pins_stay(tmp_path) -> None:
    folder, pins = str(tmp_path / "published"), str(tmp_path / "pins")
    for version in (1, 2):
        path = _publish(folder, version)
    pin = pin_newest(folder, pins, keep=2)
    assert pin == os.path.join(pins, "version_2")
    assert os.path.samefile(os.path.join(pin, "model.safetensors"), os.path.join(path, "model.safetensors"))
    shutil.rmtree(path)  # the trainer prunes it
    assert open(os.path.join(pin, "model.safetensors")).read() == "weights 2"
    assert pin_newest(folder, pins, keep=2) == pin  # the newest pinned already: the same pin
    for version in (3, 4):
        _publish(folder, version)
        pin_newest(folder, pins, keep=2)
    assert sorted(os.listdir(pins)) == ["version_3", "version_4"]


def test_pinning_names_the_folder_when_nothing_is_published_or_it_keeps_vanishing(tmp_path) -> None:
    folder = str(tmp_path / "published")
    os.makedirs(folder)
    with pytest.raises(FileNotFoundError, match="no weights published in .*published yet"):
        pin_newest(folder, str(tmp_path / "pins"), keep=1)
    shutil.rmtree(_publish(folder, 7))  # latest.json names a version pruned each time we look
    with pytest.raises(RuntimeError, match="pruned 10 times"):
        pin_newest(folder, str(tmp_path / "pins"), keep=1)
