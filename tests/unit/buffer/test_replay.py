"""The replay buffer (buffer/replay.py): priority order, reuse after the cooldown, the ledger of
what each step took, capacity, priority functions by name or import path; and served over gRPC by
a controller configured with it."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from rlcore.buffer import memory_buffer
from rlcore.buffer.replay import Replay, ReplayMemoryBuffer, linear_decay, resolve_priority
from tests.unit.buffer.storages import TOKEN, group


def _config(**replay) -> SimpleNamespace:
    rb = {"enable": True, "priority_fn": "linear_decay", "priority_fn_args": {}, "reuse_cooldown_time": None,
          "capacity": 100, **replay}  # fmt: skip
    return SimpleNamespace(name="exps", replay_buffer=SimpleNamespace(**rb))


def _ids(groups) -> list[str]:
    return [g[0].group_id for g in groups]


def newest_first(group, uses: int) -> float:
    """A user's priority function (by import path): the task number, higher first; uses ignored."""
    return float(group[0].group_id.removeprefix("t"))


def test_linear_decay_takes_the_freshest_first_and_reuses_after_the_cooldown() -> None:
    buffer = memory_buffer(_config(reuse_cooldown_time=0.3, priority_fn_args={"decay": 2.0}))
    assert isinstance(buffer, ReplayMemoryBuffer)
    buffer.put([group("t0", version=0), group("t1", version=1), group("t2", version=3)])
    assert _ids(buffer.take(0, 2, timeout_s=5).groups) == ["t2", "t1"]  # newest policy first
    # t2 and t1 cool down: only t0 is ready; the step waits for the cooldown to fill up
    start = time.monotonic()
    step1 = buffer.take(1, 2, timeout_s=5).groups
    assert time.monotonic() - start >= 0.25
    # priorities now: t0 0, t1 1 - 2 = -1, t2 3 - 2 = 1
    assert _ids(step1) == ["t2", "t0"]
    assert _ids(buffer.take(0, 2, timeout_s=5).groups) == ["t2", "t1"]  # the ledger: step 0 again
    assert buffer.reused() == 1 and buffer.stats().groups_taken == 4


def test_without_a_cooldown_groups_are_taken_once_in_priority_order() -> None:
    buffer = memory_buffer(_config(priority_fn=f"{__name__}:newest_first"))
    buffer.put([group(f"t{i}") for i in (3, 9, 1, 5)])
    assert _ids(buffer.take(0, 3, timeout_s=5).groups) == ["t9", "t5", "t3"]
    buffer.finish()
    last = buffer.take(1, 3, timeout_s=5)
    assert _ids(last.groups) == ["t1"] and last.exhausted


def test_past_capacity_the_lowest_priority_groups_leave() -> None:
    buffer = memory_buffer(_config(capacity=2))
    buffer.put([group("old", version=0), group("new", version=5), group("mid", version=2)])
    assert buffer.stats().available == 2
    buffer.finish()
    assert _ids(buffer.take(0, 3, timeout_s=5).groups) == ["new", "mid"]


def test_a_priority_function_is_checked_with_its_args() -> None:
    assert resolve_priority("linear_decay", {"decay": 0.5})(group("t", version=4), 2) == 3.0
    assert resolve_priority("reward_spread", {})(group("t"), 0) == pytest.approx((2 / 3) ** 0.5)
    with pytest.raises(ValueError, match=r"replay_buffer\.priority_fn_args \{'decai': 1\} do not fit linear_decay"):
        resolve_priority("linear_decay", {"decai": 1})
    with pytest.raises(ValueError, match=r"replay_buffer\.priority_fn 'nowhere:fn': cannot import module"):
        resolve_priority("nowhere:fn", {})


def test_a_controller_serves_the_queue_with_its_replay_buffer() -> None:
    from rlcore.buffer.queue import QueueBuffer
    from rlcore.buffer.service import BufferServicer, buffer_service
    from rlcore.client.base import ClientOptions
    from rlcore.core.rpc.server import RpcServer, ServerOptions

    servicer = BufferServicer(configs={"exps": _config(reuse_cooldown_time=0.0)})
    server = RpcServer(ServerOptions(token=TOKEN, host="127.0.0.1", port=0), [buffer_service(servicer)])
    try:
        client = QueueBuffer("exps", server.address, ClientOptions(token=TOKEN, timeout=30.0))
        client.put([group("a", version=1), group("b", version=2)])
        steps = [_ids(client.take(step, 1, timeout_s=5).groups) for step in range(4)]
        client.close()
    finally:
        server.stop(grace=0.5)
    # b (version 2) first; then a (1) over b (2 - 2 x 1 = 0); then b (0) over a (1 - 2 = -1); ...
    assert steps == [["b"], ["a"], ["b"], ["a"]]
    assert isinstance(servicer.queue("exps"), ReplayMemoryBuffer)
    assert linear_decay(group("a", version=1), 1) == -1.0
    assert Replay.from_config(_config().replay_buffer).cooldown_s is None


def test_a_saved_in_memory_buffer_comes_back_where_it_stood() -> None:
    """state_dict / load_state_dict (an asynchronous run's checkpoint): the next take is the next
    step, the groups not taken yet come back in order, and with replay each keeps its uses and
    cooldown; a step before the saved one is not known."""
    import json

    from rlcore.buffer.base import BufferError
    from rlcore.buffer.memory import MemoryBuffer

    plain = MemoryBuffer("exps")
    plain.put([group(f"t{i}") for i in range(5)])
    plain.take(0, 2, timeout_s=5)
    back = MemoryBuffer("exps")
    back.load_state_dict(json.loads(json.dumps(plain.state_dict())))  # as a checkpoint's JSON
    assert back.stats().steps_taken == 1 and back.stats().available == 3
    assert _ids(back.take(1, 2, timeout_s=5).groups) == ["t2", "t3"]
    assert back.take(1, 2, timeout_s=5).groups[0][0] == plain.take(1, 2, timeout_s=5).groups[0][0]
    with pytest.raises(BufferError, match="asks for step 0, but the buffer has taken 2 step"):
        back.take(0, 2, timeout_s=5)

    replay = memory_buffer(_config(reuse_cooldown_time=60.0, priority_fn_args={"decay": 2.0}))
    replay.put([group("t0", version=0), group("t1", version=1), group("t2", version=3)])
    replay.take(0, 1, timeout_s=5)  # t2, cooling down for a minute
    again = memory_buffer(_config(reuse_cooldown_time=60.0, priority_fn_args={"decay": 2.0}))
    again.load_state_dict(json.loads(json.dumps(replay.state_dict())))
    assert again.stats().available == 2  # t2 still cools down
    assert _ids(again.take(1, 2, timeout_s=5).groups) == ["t1", "t0"]
