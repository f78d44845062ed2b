"""Several training models on one trainer world, taking turns (a multi-tenant `rlcore tinker serve`).

The trainer world holds one model at a time: its weights, adapter, optimizer and step count. Each
model's training requests wait in a queue of its own, in the order they came, and one thread runs
them, the oldest first. Before a request of a model that does not hold the world runs, the holder's
state is saved (`save(model)`: one folder per model, replaced at each of its turns, apart from the
checkpoints its client names), the next model is built (`configure`) and its state comes back if it
held the world before (LoadCheckpoint): every model trains as it would alone, with its own
optimizer state and step count (its losses are its single-tenant run's).

Gradients that a forward_backward left for an optim_step are in no checkpoint, so the world changes
hands only between a model's optim_step and its next forward_backward: while the holder has
gradients waiting, its own requests go first, and the others wait up to `hold_s` for it to send
them. A holder silent that long loses them to the next model; its optim_step then fails in one line
saying so (an optimizer step on no gradients would still move Adam's moments), and whatever it
accumulated since goes too (it is rebuilt from the state saved before them).

At most `max_models` models at once; creating one more is refused in one line (a finished session's
models go).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .errors import UserError
from .records import ModelSpec

log = logging.getLogger("rlcore.tinker")

HOLD_S = 30.0
"""How long the world waits for the optim_step of a holder with gradients waiting."""


@dataclass
class _Request:
    order: int
    fn: Callable[[], Any]
    future: Future


class TrainTurns:
    """The queues, the holder and the saved states (the module's docstring). `configure(model_id,
    spec)` builds a model on the world, `save(model_id)` saves the holder's state and returns its
    folder, `trainer` loads one back; `failed(why)` is the result a request that cannot run gets."""

    def __init__(
        self, trainer: Any, configure: Callable[[str, ModelSpec], None], save: Callable[[str], str],
        failed: Callable[[str], Any], max_models: int, hold_s: float = HOLD_S,
    ):  # fmt: skip
        self.trainer, self.configure, self.save, self.failed = trainer, configure, save, failed
        self.max_models, self.hold_s = max_models, hold_s
        self.holder: str | None = None
        self.waiting_grads = False
        """The holder ran a forward_backward that trains, and no optim_step since."""
        self.saved: dict[str, str] = {}
        """model -> the folder of its state, saved when it gave the world up."""
        self.lost: set[str] = set()
        """Models whose waiting gradients went to another model's turn."""
        self._queues: dict[str, deque[_Request]] = {}
        self._order = itertools.count()
        self._until = 0.0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tinker-train", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the request threads' side

    def submit(self, model_id: str, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        with self._cond:
            if self._closed:
                future.set_result(self.failed("the server is stopping"))
                return future
            self._queues.setdefault(model_id, deque()).append(_Request(next(self._order), fn, future))
            self._cond.notify_all()
        return future

    def admit(self, model_id: str, models: dict[str, ModelSpec]) -> None:
        """Refuse a new model beyond max_models (`models`: those held now)."""
        if model_id not in models and len(models) >= self.max_models:
            raise UserError(f"create_model: this server trains at most {self.max_models} models at once "
                            "(rlcore tinker serve --max-models); finish a session (its models go) or ask "
                            "the server's owner for more")  # fmt: skip

    def drop(self, model_id: str) -> None:
        """A model that is gone (its session finished): its waiting requests fail, its state goes."""
        with self._cond:
            queue = self._queues.pop(model_id, deque())
            self.saved.pop(model_id, None)
            self.lost.discard(model_id)
            if self.holder == model_id:
                self.holder, self.waiting_grads = None, False
        self._fail(queue, f"model_id: {model_id} is gone (its session finished)")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            queues, self._queues = list(self._queues.values()), {}
            self._cond.notify_all()
        for queue in queues:
            self._fail(queue, "the server is stopping")

    def _fail(self, queue: deque[_Request], why: str) -> None:
        for request in queue:
            if request.future.set_running_or_notify_cancel():
                request.future.set_result(self.failed(why))

    # ------------------------------------------------------------------ the training thread's side

    def hold(self, model_id: str, spec: ModelSpec, fresh: bool = False) -> None:
        """Give `model_id` the world (on the training thread, before its request runs); `fresh`: a
        new model (create_model, or one created from a checkpoint), built without a saved state."""
        with self._cond:
            holder, waiting = self.holder, self.waiting_grads
        if holder == model_id and not fresh:
            return
        if holder is not None and holder != model_id:
            folder = self.save(holder)
            with self._cond:
                if holder in self._queues or holder == self.holder:  # not dropped meanwhile
                    self.saved[holder] = folder
                if waiting:
                    self.lost.add(holder)
                    log.warning("model %s: its gradients waiting for an optim_step went to %s's turn", holder, model_id)
        with self._cond:
            self.holder, self.waiting_grads = None, False  # a failed build leaves the world to nobody
        self.configure(model_id, spec)
        if fresh:
            with self._cond:
                self.saved.pop(model_id, None)
                self.lost.discard(model_id)
        elif model_id in self.saved:
            self.trainer.load_checkpoint(self.saved[model_id])
        with self._cond:
            self.holder = model_id

    def trained(self) -> None:
        """The holder's forward_backward left gradients for its optim_step."""
        with self._cond:
            self.waiting_grads, self._until = True, time.monotonic() + self.hold_s

    def stepping(self, model_id: str) -> None:
        """Before the holder's optim_step: fails if its gradients went to another model's turn, and
        then drops what it accumulated since (its next request rebuilds it from its saved state)."""
        with self._cond:
            lost = model_id in self.lost
            self.lost.discard(model_id)
            self.waiting_grads = False
            if lost:
                self.holder = None
        if lost:
            raise UserError(f"optim_step: the gradients of model {model_id}'s forward_backward were dropped: "
                            f"another model took the trainer after waiting {self.hold_s:g} s for this optim_step; "
                            "run forward_backward again")  # fmt: skip

    def _next(self) -> _Request | None:
        """The request to run now, if any (holding the condition)."""
        if self.waiting_grads and self.holder is not None:
            own = self._queues.get(self.holder)
            if own:
                return own.popleft()
            if time.monotonic() < self._until:
                return None
        heads = [(q[0].order, m) for m, q in self._queues.items() if q]
        return self._queues[min(heads)[1]].popleft() if heads else None

    def _run(self) -> None:
        while True:
            with self._cond:
                request = self._next()
                while request is None:
                    if self._closed:
                        return
                    left = self._until - time.monotonic()
                    self._cond.wait(timeout=left if self.waiting_grads and left > 0 else None)
                    request = self._next()
            if not request.future.set_running_or_notify_cancel():
                continue
            try:
                request.future.set_result(request.fn())
            except BaseException as e:  # the fn answers its own errors (service._answer): a bug
                request.future.set_exception(e)
