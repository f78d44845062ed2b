"""The explorer's half of a decoupled run's weights (the trainer's half: publisher.py): the newest
version the trainer published (a folder; with plan.explorer_weights nccl also a push to the rollout
workers registered in the folder), waited for while it is too old, and loaded into the workers.
publish.py says what the two launches write in the folder they share."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..client.base import RpcError
from ..core.config.schema import SynchronizerConfig
from .base import announce
from .publish import last_push, latest_published, register_receivers, unregister_receivers

log = logging.getLogger("rlcore.explore")

CHECK_S = 1.0
"""How often an explorer waiting for weights asks whether the run stops and the trainer launch lives."""
POLL_S = 0.5

T = TypeVar("T")


def wait_for_weights(
    folder: str, after: int, wait_s: float, what: str, stop: threading.Event | None = None,
    check: Callable[[], bool] | None = None, newest: Callable[[], tuple[int, str] | None] | None = None,
) -> tuple[int, str] | None:  # fmt: skip
    """The newest published (version, path) in `folder` once one newer than `after` is there;
    None when `stop` is set first. `check`, called at once and then about once a second, returns
    True when the run asks to stop (then None too). `newest()`: what is newest instead of the
    folder's latest version (path "" for weights the workers already hold)."""
    look = newest or (lambda: latest_published(folder))

    def newer() -> tuple[int, str] | None:
        latest = look()
        return latest if latest is not None and latest[0] > after else None

    return poll_until(newer, wait_s, stop, check, lambda: (
        f"{what}: the trainer published no weights newer than version {after} in {folder} within "
        f"{wait_s:g} s (buffer.trainer_input.experience_buffer.max_wait_s): is the mode-train launch "
        "of this run (same checkpoint_root_dir, project and name) running?"
    ))  # fmt: skip


def poll_until(
    ready: Callable[[], T | None], wait_s: float, stop: threading.Event | None, check: Callable[[], bool] | None,
    timed_out: Callable[[], str],
) -> T | None:  # fmt: skip
    """`ready()`'s first answer that is not None, asked every POLL_S; None when `stop` is set or
    `check()` (asked at once, then about once a second) says the run stops; after `wait_s`,
    TimeoutError(timed_out())."""
    deadline = time.monotonic() + wait_s
    checked = -CHECK_S  # at once, then about once a second
    while (got := ready()) is None:
        if check is not None and time.monotonic() - checked >= CHECK_S:
            checked = time.monotonic()
            if check():
                return None
        if time.monotonic() > deadline:
            raise TimeoutError(timed_out())
        if stop is not None and stop.wait(POLL_S):
            return None
        if stop is None:
            time.sleep(POLL_S)
    return got


class WeightsFollower:
    def __init__(
        self, folder: str, synchronizer: SynchronizerConfig, clients: list[Any], holds: int, by_group: bool,
        token: str,
    ):  # fmt: skip
        """Follow the versions published in `folder` on the rollout workers `clients`, which hold
        published version `holds` (-1: none of this stage's). `by_group`: the trainer pushes its
        versions to the workers registered in the folder (plan.explorer_weights nccl; else folders
        only), which `token` (their launch's) admits."""
        from .sender import connect

        self.folder, self.synchronizer, self.by_group, self.token = folder, synchronizer, by_group, token
        self.clients = list(clients)
        self.sender = connect(self.clients, synchronizer)  # only ever asked to load a folder: no group
        self.version = holds
        """The published version the workers hold."""
        self.served = max(c.get_info().policy_version for c in self.clients)
        """The version number the workers were last given (theirs only grow: announce)."""
        self.registered: list[str] | None = None
        """The workers registered in the folder for the trainer's pushes (None: none yet)."""

    def workers_changed(self, clients: list[Any], joined: bool) -> None:
        """The workers are `clients` now; `joined`: some are new (they hold other weights: every
        worker loads the next version, however new the others' are)."""
        from .sender import connect

        self.clients = list(clients)
        self.sender.close()
        self.sender = connect(self.clients, self.synchronizer)
        if joined:
            self.version = -1

    def follow(
        self, need: int, wait_s: float, what: str, stop: threading.Event, check: Callable[[], bool],
        load: Callable[[str], dict[str, float]],
    ) -> dict[str, float] | None:  # fmt: skip
        """Have the workers hold published version `need` or newer (waiting for it until `stop`, or
        `check()` says the run stops: None then); `load(path)` has them load a folder (the caller's
        failover around `self.load`). Metrics of the wait and the load."""
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        newest = None
        if self.by_group:
            self._register()
            newest = self._newest
        latest = wait_for_weights(self.folder, need - 1, wait_s, what, stop, check, newest)
        if latest is None:
            return None
        if time.perf_counter() - start > POLL_S:
            metrics["perf/wait_for_weights_s"] = time.perf_counter() - start
        version, path = latest
        if version > self.version and not path:  # the trainer pushed it to every worker
            self.version = version
            log.info("the rollout workers hold version %d (pushed over a group)", version)
        elif version > self.version:  # tasks left running go on (their next engine calls wait for it)
            self.served = announce(version, self.served)
            stats = load(path)
            self.version = version
            metrics["perf/load_weights_s"] = stats.get("total_s", 0.0)
            log.info("the rollout workers hold version %d (%s)", version, path)
        return metrics

    def await_unpaused(self, wait_s: float, what: str, stop: threading.Event, check: Callable[[], bool]) -> bool:
        """Wait until no worker is paused (a weight update held them: one running, or one whose
        sender died part way, which the next version's update ends); False when `stop` is set or
        `check()` says the run stops first. What they hold then is not known (a resumed trainer
        pushes its checkpoint's weights again, older than those they held): the next `follow`
        takes the newest as new."""
        paused: list[str] = []

        def none_paused() -> bool | None:
            paused[:] = [c.address for c in self.clients if _paused(c)]
            return None if paused else True

        if poll_until(none_paused, wait_s, stop, check, lambda: (
            f"{what}: rollout worker(s) {', '.join(paused)} stayed paused for {wait_s:g} s "
            "(buffer.trainer_input.experience_buffer.max_wait_s): a weight update that did not finish "
            "holds them until the next version reaches them; is the mode-train launch of this run "
            "running? (a Resume call reopens them by hand)"
        )) is None:  # fmt: skip
            return False
        self.version = -1
        return True

    def load(self, path: str, again: bool = False) -> dict[str, float]:
        """Have the workers load the published folder `path`; `again`: after some took its number
        (a load that failed part way), under a newer one."""
        if again:
            self.served = announce(self.served, self.served)
        return self.sender.send_checkpoint(path, self.served)

    def _register(self) -> None:
        """Tell the trainer which workers to push to (when they change), and the version they all
        hold (-1: a restarted one holds older weights)."""
        now = [c.address for c in self.clients]
        if now != self.registered:
            register_receivers(self.folder, now, self.version, self.token)
            self.registered = now

    def _newest(self) -> tuple[int, str] | None:
        """The trainer's newest push once every worker serves it (path ""), else the newest published
        folder (what it publishes when no group forms)."""
        folder, push = latest_published(self.folder), last_push(self.folder)
        if push is None or (folder is not None and folder[0] > push[0]):
            return folder
        try:
            served = [c.get_info(timeout=10.0).policy_version for c in self.clients]
        except RpcError:  # a worker went: the next step leaves it out
            return folder
        self.served = max(self.served, *served)  # folder loads announce past the pushed numbers
        return (push[0], "") if min(served) >= push[1] else folder

    def close(self) -> None:
        self.sender.close()
        if self.registered is not None:  # the trainer publishes folders again
            unregister_receivers(self.folder)


def _paused(client: Any) -> bool:
    """Whether the worker answers and is paused (one that does not answer is not waited for here:
    the step's failover leaves it out)."""
    try:
        return bool(client.get_info(timeout=10.0).paused)
    except RpcError:
        return False
