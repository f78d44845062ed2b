"""RolloutAhead: one rollout in a thread while a step trains; its result, version and failure."""

from __future__ import annotations

import threading

import pytest

from rlcore.runtime.rollout_ahead import RolloutAhead


def test_the_rollout_runs_while_the_caller_works_and_is_taken_by_its_step() -> None:
    ahead = RolloutAhead(True)
    assert ahead.take(0) is None and ahead.wait() == {}  # nothing started
    release = threading.Event()
    # run in the caller's thread, the rollout would block start() and then time out
    ahead.start(1, lambda: ["exp"] if release.wait(5) else ["timed out"], version=4)
    release.set()
    assert set(ahead.wait()) == {"perf/rollout_ahead_wait_s"}
    assert ahead.take(1) == (["exp"], 4)
    assert ahead.take(2) is None  # taken once
    ahead.close()


def test_a_failed_rollout_raises_at_wait_and_a_disabled_one_never_starts() -> None:
    ahead = RolloutAhead(True)

    def fail() -> None:
        raise ConnectionError("worker 0 went away")

    ahead.start(3, fail)
    with pytest.raises(ConnectionError, match="worker 0 went away"):
        ahead.wait()
    ahead.close()
    off = RolloutAhead(False)
    assert not off.enabled and off.take(0) is None and off.wait() == {}
