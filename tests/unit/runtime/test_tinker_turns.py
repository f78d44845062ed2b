"""Training models taking turns on one trainer world (runtime/tinker/turns.py): the world changes
hands with the holder's state saved and the next one's restored, never while the holder's gradients
wait for its optim_step (unless it stays silent past hold_s, and then its optim_step says so), at
most max_models at once. The trainer here records what it is asked (the world itself is exercised
by test_tinker_server.py's two clients)."""

from __future__ import annotations

import threading
import time

import pytest

from rlcore.runtime.tinker.errors import UserError
from rlcore.runtime.tinker.records import ModelSpec
from rlcore.runtime.tinker.turns import TrainTurns

SPEC = ModelSpec("m", 4)


class Trainer:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.holds = ""

    def configure(self, model_id: str, spec: ModelSpec) -> None:
        self.calls.append(f"configure {model_id}")
        self.holds = model_id

    def save(self, model_id: str) -> str:
        assert model_id == self.holds, "saves the model the world holds"
        self.calls.append(f"save {model_id}")
        return f"ckpt-{model_id}"

    def load_checkpoint(self, path: str) -> None:
        self.calls.append(f"load {path}")


def _turns(hold_s: float = 5.0) -> tuple[TrainTurns, Trainer]:
    trainer = Trainer()
    turns = TrainTurns(trainer, trainer.configure, trainer.save, lambda why: f"failed: {why}", 2, hold_s)
    return turns, trainer


def _request(turns: TrainTurns, model_id: str, log: list[str], what: str, fresh: bool = False):
    def run() -> str:
        turns.hold(model_id, SPEC, fresh=fresh)
        if what == "fb":
            turns.trained()
        elif what == "step":
            turns.stepping(model_id)
        log.append(f"{model_id} {what}")
        return what

    return turns.submit(model_id, run)


def test_the_world_changes_hands_with_each_models_state_saved_and_restored() -> None:
    turns, trainer = _turns()
    log: list[str] = []
    futures = [_request(turns, "a", log, "create", fresh=True), _request(turns, "b", log, "create", fresh=True),
               _request(turns, "a", log, "forward"), _request(turns, "b", log, "forward")]  # fmt: skip
    assert [f.result(5) for f in futures] == ["create", "create", "forward", "forward"]
    assert trainer.calls == [
        "configure a", "save a", "configure b", "save b", "configure a", "load ckpt-a", "save a", "configure b",
        "load ckpt-b",
    ]  # fmt: skip
    turns.close()


def test_a_holders_waiting_gradients_keep_the_world_until_its_optim_step() -> None:
    turns, trainer = _turns()
    log: list[str] = []
    _request(turns, "a", log, "create", fresh=True).result(5)
    fb = _request(turns, "a", log, "fb")
    fb.result(5)
    other = _request(turns, "b", log, "create", fresh=True)  # older than a's optim_step, but a's gradients wait
    time.sleep(0.3)
    assert not other.done()
    _request(turns, "a", log, "step").result(5)
    other.result(5)
    assert log == ["a create", "a fb", "a step", "b create"]
    turns.close()


def test_a_silent_holder_loses_its_gradients_and_its_optim_step_says_so() -> None:
    turns, _ = _turns(hold_s=0.2)
    log: list[str] = []
    _request(turns, "a", log, "create", fresh=True).result(5)
    _request(turns, "a", log, "fb").result(5)
    _request(turns, "b", log, "create", fresh=True).result(5)  # after 0.2 s
    _request(turns, "a", log, "fb").result(5)  # accumulated after its gradients went: dropped too
    with pytest.raises(UserError, match="optim_step: the gradients of model a's forward_backward were dropped"):
        _request(turns, "a", log, "step").result(5)
    trainer = turns.trainer
    trainer.calls.clear()
    assert _request(turns, "a", log, "fb").result(5) == "fb"  # rebuilt from its saved state, and trains on
    assert trainer.calls == ["configure a", "load ckpt-a"]
    turns.close()


def test_models_beyond_the_limit_are_refused_and_a_dropped_models_requests_fail() -> None:
    turns, _ = _turns()
    turns.admit("a", {})
    with pytest.raises(UserError, match=r"create_model: this server trains at most 2 models at once .*--max-models"):
        turns.admit("c", {"a": SPEC, "b": SPEC})
    turns.admit("a", {"a": SPEC, "b": SPEC})  # one it holds already
    gate = threading.Event()
    busy = turns.submit("b", lambda: gate.wait(5))
    waiting = turns.submit("a", lambda: "never")
    turns.drop("a")
    gate.set()
    assert busy.result(5)
    assert waiting.result(5) == "failed: model_id: a is gone (its session finished)"
    turns.close()
    assert turns.submit("b", lambda: "never").result(5) == "failed: the server is stopping"
