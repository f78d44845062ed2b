"""A decoupled run's trainer side of the weights (weights/publisher.py) with plan.explorer_weights
nccl: the first version a folder, later ones pushed to the workers the explorer registered, a folder
whenever none are registered or the push fails, and a push again while the trainer waits when the
explorer registers workers that lack the newest version."""

from __future__ import annotations

import pytest

from rlcore.core.config.plan import plan_stage
from rlcore.runtime.handles import Synced
from rlcore.weights.publish import register_receivers, registered_receivers, unregister_receivers
from rlcore.weights.publisher import Publisher

from ..config.minimal import resolve


class Trainer:
    """The two calls a Publisher makes of its TrainerHandle, recorded; a push fails on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fail = False

    def publish_weights(self, folder: str) -> tuple[int, Synced]:
        self.calls.append(("folder",))
        return len(self.calls), Synced(0, 0.0)

    def push_weights(self, endpoints: list[str], transport: str, token: str) -> tuple[int, float]:
        self.calls.append(("push", tuple(endpoints), transport, token))
        if self.fail:
            raise RuntimeError("weight-sync group did not form")
        return 7, 0.0

@pytest.fixture
def publisher(tmp_path) -> tuple[Publisher, Trainer, str]:
    plan = plan_stage(resolve(tmp_path, "synchronizer.sync_method=nccl", "mode=train"))
    assert plan.explorer_weights == "nccl"
    trainer, folder = Trainer(), str(tmp_path / "published")
    return Publisher(plan, trainer, folder), trainer, folder  # type: ignore[arg-type]

def test_the_first_version_is_a_folder_later_ones_go_to_the_registered_workers(publisher) -> None:
    pub, trainer, folder = publisher
    register_receivers(folder, ["w:1", "w:2"], 0, "their-token")
    pub.publish(0)
    assert trainer.calls == [("folder",)]  # the workers start from it
    pub.publish(1)
    assert trainer.calls[-1] == ("push", ("w:1", "w:2"), "nccl", "their-token")
    assert pub.on_wait() == {}  # the same workers: nothing to push
    unregister_receivers(folder)  # the explorer finished
    assert registered_receivers(folder) == ([], -1, "")
    pub.publish(2)
    assert trainer.calls[-1] == ("folder",)

def test_a_failed_push_publishes_a_folder_and_new_workers_lacking_the_newest_get_it_while_waiting(publisher) -> None:
    pub, trainer, folder = publisher
    pub.publish(0)
    register_receivers(folder, ["w:1"], 0, "t")
    trainer.fail = True
    pub.publish(1)
    assert [c[0] for c in trainer.calls] == ["folder", "push", "folder"]
    trainer.fail = False
    register_receivers(folder, ["w:1", "w:3"], 1, "t")  # they hold step 1 (its folder): nothing to do
    assert pub.on_wait() == {} and len(trainer.calls) == 3
    register_receivers(folder, ["w:1", "w:4"], -1, "t")  # w:4 restarted from older weights
    assert pub.on_wait()["sync/published_version"] == 1.0
    assert trainer.calls[-1] == ("push", ("w:1", "w:4"), "nccl", "t")
    assert pub.on_wait() == {}  # pushed to them already

def test_a_push_cut_by_the_explorer_finishing_is_no_warning(publisher, caplog) -> None:
    """The explorer finished (unregistering its workers, which then stop) while a push to them ran:
    the push fails, and a folder goes out as always, but nothing failed: said at info, where a
    push to workers still registered that fails is a warning."""
    import logging

    pub, trainer, folder = publisher
    pub.publish(0)
    register_receivers(folder, ["w:1"], 0, "t")
    trainer.fail = True
    with caplog.at_level(logging.INFO, logger="rlcore.loop"):
        pub.publish(1)  # still registered: a real failure
        unregister_receivers(folder)
        register_receivers(folder, ["w:1"], 1, "t")
        original = trainer.push_weights

        def finishing(*args):
            unregister_receivers(folder)  # the explorer's close, during the push
            return original(*args)

        trainer.push_weights = finishing  # type: ignore[method-assign]
        pub.publish(2)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "could not push the weights" in warned[0]
    assert any("left during the push (it finished" in r.getMessage() for r in caplog.records)
    assert [c[0] for c in trainer.calls] == ["folder", "push", "folder", "push", "folder"]


def test_folders_only_without_sync_method_nccl(tmp_path) -> None:
    plan = plan_stage(resolve(tmp_path, "mode=train"))
    assert plan.explorer_weights == "publish"
    trainer, folder = Trainer(), str(tmp_path / "published")
    pub = Publisher(plan, trainer, folder)  # type: ignore[arg-type]
    register_receivers(folder, ["w:1"], -1, "t")
    pub.publish(0)
    pub.publish(1)
    assert pub.on_wait() == {} and trainer.calls == [("folder",), ("folder",)]
