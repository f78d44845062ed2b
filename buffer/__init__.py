"""The experience buffer between explorers and the trainer (modes explore and train): the
ExperienceBuffer interface (base.py) and its storages, one file each.

    queue   memory.py + service.py (held by a controller, served over gRPC), queue.py (its clients);
            replay.py: the replay buffer over it
    file    file.py   append-only JSONL in a shared folder
    sql     sql.py    a database through SQLAlchemy (SQLite by default, PostgreSQL...)

`open_buffer` is the one place that opens one for a config.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from ..core.registry import Registry

if TYPE_CHECKING:
    from .base import ExperienceBuffer
    from .memory import MemoryBuffer

STORAGES = Registry(
    "buffer.trainer_input.experience_buffer.storage_type",
    {
        "queue": "rlcore.buffer.queue:QueueBuffer",
        "file": "rlcore.buffer.file:FileBuffer",
        "sql": "rlcore.buffer.sql:SqlBuffer",
    },
)


def project_dir(cfg: Any) -> str:
    """checkpoint_root_dir/project/name: the run folder an explore and a train launch share."""
    return os.path.abspath(os.path.join(cfg.checkpoint_root_dir, cfg.project, cfg.name))


def address_file(cfg: Any) -> str:
    """Where the mode-train launch that serves a queue writes its address."""
    eb = cfg.buffer.trainer_input.experience_buffer
    return os.path.join(project_dir(cfg), "buffer", f"{eb.name}.address")


def token_file(cfg: Any) -> str:
    """Where the mode-train launch that serves a queue leaves its token (mode 0600) for the explore
    launch of the same run, which has a token of its own for its workers."""
    return address_file(cfg).removesuffix(".address") + ".token"


def buffer_location(cfg: Any) -> str:
    """The folder, database URL or queue address of the config's experience buffer ('' for a
    queue whose address is not known yet)."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if eb.path:
        return str(eb.path)
    folder = os.path.join(project_dir(cfg), "buffer")
    if eb.storage_type == "file":
        return os.path.join(folder, eb.name)
    if eb.storage_type == "sql":
        os.makedirs(folder, exist_ok=True)
        return "sqlite:///" + os.path.join(folder, f"{eb.name}.db")
    try:
        with open(address_file(cfg)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def memory_buffer(eb: Any, where: str = "in memory") -> MemoryBuffer:
    """The in-memory queue of experience buffer config `eb` (with its replay buffer when enabled):
    asynchronous both's, or one a controller serves."""
    from .memory import MemoryBuffer

    if eb.replay_buffer.enable:
        from .replay import Replay, ReplayMemoryBuffer

        return ReplayMemoryBuffer(eb.name, Replay.from_config(eb.replay_buffer), where=where)
    return MemoryBuffer(eb.name, where=where)


def open_buffer(cfg: Any, writer: str | None = None, wait_s: float = 0.0) -> ExperienceBuffer:
    """The config's experience buffer. A queue with no path is the mode-train launch's: its address
    is waited for up to `wait_s` (the explore launch may start first)."""
    eb = cfg.buffer.trainer_input.experience_buffer
    cls = STORAGES.resolve(eb.storage_type)
    where = buffer_location(cfg)
    deadline = time.monotonic() + wait_s
    while not where and time.monotonic() < deadline:
        time.sleep(0.5)
        where = buffer_location(cfg)
    if eb.storage_type != "queue":
        return cls(eb.name, where, writer)  # type: ignore[no-any-return]
    if not where:
        from .base import BufferError

        raise BufferError(
            f"experience buffer '{eb.name}' (queue): no mode-train launch serves it ({address_file(cfg)} "
            f"did not appear within {wait_s:g} s): start it, or give the queue's host:port as "
            "buffer.trainer_input.experience_buffer.path"
        )
    import dataclasses

    from ..client.base import ClientOptions

    options = ClientOptions.from_control(cfg.control, timeout=60.0)
    if not eb.path and os.path.isfile(token_file(cfg)):  # the serving launch's token, not ours
        with open(token_file(cfg)) as f:
            options = dataclasses.replace(options, token=f.read().strip())
    return cls(eb.name, where, options, writer)  # type: ignore[no-any-return]
